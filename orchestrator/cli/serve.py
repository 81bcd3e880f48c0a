"""``sandhold serve``: the HTTP API (REST under /v1, OpenAPI, SSE) and MCP streamable HTTP at /mcp,
on one address, for the tenants of a tenants file or else one local tenant.

The port is bound before anything slow happens, so a taken port fails at once; then the image is
built if missing, the orchestrator started, ``--pool`` sessions of the default policy warmed
(with a progress display on stderr), and the address printed (with the local tenant's key
when it was just made: it is shown only that once, and kept mode 0600 in the data directory).

Stopping: the first Ctrl-C, SIGTERM or SIGHUP stops accepting requests, lets those in flight
finish for ``GRACEFUL_SHUTDOWN_TIMEOUT``, then tears down every session this server created
(shielded, bounded by the orchestrator's shutdown timeout); a second one cuts the wait for
requests short, never the teardown. A signal before serving began cancels the start-up.

Restarts: the registry (``--registry``, default ``registry.db`` in the data directory) records
every session, so a server started after a crash (``kill -9``) or a ``--keep-sessions`` stop
re-adopts the sessions it knew, their REPL state included, reaps every other container of its
orchestrator id, and prints what it did. Only one server uses a registry at a time.

Limits (``HttpLimitsConfig``; each has an option): a request head must arrive within
``--header-timeout``, an idle connection is closed after ``--keep-alive-timeout``, at most
``--max-connections`` are held (at most half the process's descriptors; the soft descriptor
limit is raised to the hard one at start) and ``--max-connections-per-client`` from one
address, ``--auth-failures-per-minute`` wrong keys per address are answered 401 (then 429), and
a tenant holds at most ``--max-streams-per-tenant`` event streams. Logs are rate-limited per
kind of message. ``--log-format json`` writes one JSON event a line (``cli._logging``); REST
answers carry ``X-Sandhold-Call-Id``, the id of the call in the audit log and the log.

Environment: the ``SANDHOLD_*`` settings of ``OrchestratorConfig.from_env`` (``SANDHOLD_IMAGE``,
``SANDHOLD_ORCHESTRATOR_ID``, ``SANDHOLD_EXTRA_LABELS``, ``SANDHOLD_REGISTRY``, ...; ``--policy``
wins over ``SANDHOLD_POLICY``), ``SANDHOLD_POOL`` for ``--pool``, and ``SANDHOLD_DATA_DIR`` for the
local key and the registry (else ``$XDG_DATA_HOME/sandhold``, else ``~/.local/share/sandhold``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import resource
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator._core.manager import MAX_POOL_SIZE
from orchestrator._core.tenants import (
    LOCAL_KEY_FILE,
    LOCAL_TENANT,
    TenantKeys,
    data_dir,
    local_tenant,
)
from orchestrator.cli._common import reported_errors, stderr
from orchestrator.cli._logging import LogFormat, configure_logging, uvicorn_log_config
from orchestrator.cli.image import with_image
from orchestrator.cli.tenant import default_tenants_file
from orchestrator.errors import InvalidArgumentError
from orchestrator.http import HttpLimitsConfig, HttpServer, build_app, limit_log_rate
from orchestrator.policy.arguments import check_policy_name
from orchestrator.policy.model import load_policy

__all__ = ["serve"]

log = logging.getLogger("orchestrator.cli.serve")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Requests in flight get this long to finish once a stop is asked for; an SSE stream would
# otherwise hold the shutdown for as long as its terminal runs.
GRACEFUL_SHUTDOWN_TIMEOUT = 5
# How often the warm-up display looks at the pool: a session takes some 0.3-0.7 s to warm.
POOL_POLL_INTERVAL = 0.1
# Serving starts anyway when no session got ready for this long (an engine refusing, a quota):
# the pool goes on filling in the background, with its own back-off.
POOL_STALL_TIMEOUT = 60.0
# Connections may use this share of the descriptor limit; sessions need the rest (engine API
# sockets, attached streams, the registry, the audit log).
CONNECTION_DESCRIPTOR_SHARE = 0.5
_LIMITS = HttpLimitsConfig()  # the options' defaults


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free one).")
    ] = 8080,
    tenants: Annotated[
        Path | None,
        typer.Option(
            help="Tenants file (TOML: one tenant table per tenant, with name, key_sha256, and "
            "optionally policies and quotas; `sandhold tenant add` writes one); default: "
            "tenants.toml in the data directory if it exists, else one local tenant, its key "
            "kept in the data directory."
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="Default policy (name or file) for sessions a call names none for."),
    ] = None,
    pool: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_POOL_SIZE,
            envvar="SANDHOLD_POOL",
            help="Sessions of the default policy to keep warm, filled before serving starts.",
        ),
    ] = 0,
    max_sessions: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="SANDHOLD_MAX_SESSIONS",
            help="Sessions this server holds at most, all tenants together; at the limit a "
            "create ends the caller's own least recently active idle session, or is refused.",
        ),
    ] = OrchestratorConfig.max_sessions,
    registry: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDHOLD_REGISTRY",
            help="The registry's SQLite file; default: registry.db in the data directory.",
        ),
    ] = None,
    keep_sessions: Annotated[
        bool,
        typer.Option(
            help="On a stop signal, leave the sessions running for the next start to re-adopt "
            "(default: destroy them)."
        ),
    ] = False,
    max_connections: Annotated[
        int, typer.Option(min=1, help="Connections held at once (at most half the descriptors).")
    ] = _LIMITS.max_connections,
    max_connections_per_client: Annotated[
        int, typer.Option(min=1, help="Connections held at once from one client address.")
    ] = _LIMITS.max_connections_per_client,
    header_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a request head may take to arrive.")
    ] = _LIMITS.header_timeout,
    keep_alive_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds an idle connection is kept open.")
    ] = _LIMITS.keep_alive_timeout,
    auth_failures_per_minute: Annotated[
        int,
        typer.Option(min=1, help="Wrong API keys one address may present a minute; then 429."),
    ] = _LIMITS.auth_failures_per_minute,
    max_streams_per_tenant: Annotated[
        int, typer.Option(min=1, help="Event streams (SSE, GET /mcp) a tenant holds at once.")
    ] = _LIMITS.max_streams_per_tenant,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            help="Logs on stderr: text lines, or one JSON event a line (time, level, event, "
            "logger, session, tenant, call_id)."
        ),
    ] = "text",
) -> None:
    """Serve the sandbox tools over HTTP (REST, OpenAPI, SSE) and MCP until stopped."""
    configure_logging(log_format)
    with reported_errors():
        config = OrchestratorConfig.from_env(**({"default_policy": policy} if policy else {}))
        load_policy(config.default_policy, search_dirs=config.policy_dirs)  # fail before a build
        if pool:
            config = _with_pool(config, pool)
        tenants = _tenants_file(tenants)
        keys, notice = _keys(tenants)
        limits = _within_descriptors(
            HttpLimitsConfig(
                max_connections=max_connections,
                max_connections_per_client=min(max_connections_per_client, max_connections),
                header_timeout=header_timeout,
                keep_alive_timeout=keep_alive_timeout,
                auth_failures_per_minute=auth_failures_per_minute,
                max_streams_per_tenant=max_streams_per_tenant,
            )
        )
        config = dataclasses.replace(
            config,
            registry_path=registry or config.registry_path or data_dir() / "registry.db",
            on_shutdown="persist" if keep_sessions else "destroy",
            max_sessions=max_sessions,
            tenants=keys.tenants if tenants is not None else {},
        )
        listener = _listen(host, port)
        with listener:
            stopped_by = anyio.run(
                _serve_until_stopped, config, keys, limits, listener, host, notice, log_format
            )
    if stopped_by is not None:
        raise typer.Exit(128 + stopped_by)


def _with_pool(config: OrchestratorConfig, size: int) -> OrchestratorConfig:
    try:
        check_policy_name(config.default_policy)  # pools are kept per policy name
    except InvalidArgumentError:
        raise InvalidArgumentError("--pool needs a policy name, not a policy file") from None
    return dataclasses.replace(config, pool={config.default_policy: size})


def _tenants_file(given: Path | None) -> Path | None:
    """``--tenants``, else the data directory's ``tenants.toml`` when there is one (which
    ``sandhold tenant add`` writes), else None: the one local tenant."""
    if given is not None:
        return given
    default = default_tenants_file()
    return default if default.exists() else None


def _keys(tenants: Path | None) -> tuple[TenantKeys, str]:
    """The API keys, and what to tell the person who started the server about them."""
    if tenants is not None:
        keys = TenantKeys.from_file(tenants)
        return keys, f"API keys: {len(keys.tenants)} tenant(s) from {tenants}"
    directory = data_dir()
    keys, key, created = local_tenant(directory)
    where = directory / LOCAL_KEY_FILE
    if created:
        return keys, f"API key for tenant {LOCAL_TENANT!r} (shown once; kept in {where}): {key}"
    return keys, f"API key for tenant {LOCAL_TENANT!r}: the one in {where}"


def _within_descriptors(limits: HttpLimitsConfig) -> HttpLimitsConfig:
    """Raise the soft descriptor limit to the hard one, and hold no more connections than the
    share of it they may use."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return limits
    share = max(1, int(soft * CONNECTION_DESCRIPTOR_SHARE))
    if limits.max_connections <= share:
        return limits
    log.warning(
        "holding at most %d connections, not %d: the descriptor limit is %d",
        share, limits.max_connections, soft,
    )  # fmt: skip
    return dataclasses.replace(
        limits,
        max_connections=share,
        max_connections_per_client=min(limits.max_connections_per_client, share),
    )


def _listen(host: str, port: int) -> socket.socket:
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return socket.create_server(address[:2], family=family)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {reason}") from None


def _url(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(HttpServer):
    """uvicorn without signal handlers of its own: this command handles the signals (uvicorn's
    would re-raise a caught SIGTERM after serving, killing the process before the teardown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclasses.dataclass
class _Run:
    startup: anyio.CancelScope
    server: _Server | None = None
    received: list[int] = dataclasses.field(default_factory=list)


async def _serve_until_stopped(
    config: OrchestratorConfig,
    keys: TenantKeys,
    limits: HttpLimitsConfig,
    listener: socket.socket,
    host: str,
    notice: str,
    log_format: LogFormat,
) -> int | None:
    """Serve until a stop signal (its number is returned); the signal receiver stays open until
    the teardown has ended, so no second signal can kill the process halfway through it."""
    run = _Run(startup=anyio.CancelScope())
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with anyio.create_task_group() as group:
            group.start_soon(_stop_on_signals, signals, run)
            with run.startup:
                config = await with_image(config)
            if not run.received:
                await _serve(config, keys, limits, listener, host, notice, log_format, run)
            group.cancel_scope.cancel()
    return run.received[0] if run.received else None


async def _stop_on_signals(signals: AsyncIterator[signal.Signals], run: _Run) -> None:
    async for signum in signals:
        run.received.append(signum)
        log.info("stopping on %s", signal.Signals(signum).name)
        if run.server is None:
            run.startup.cancel()
        elif run.server.should_exit:
            run.server.force_exit = True
        else:
            run.server.should_exit = True


async def _serve(
    config: OrchestratorConfig,
    keys: TenantKeys,
    limits: HttpLimitsConfig,
    listener: socket.socket,
    host: str,
    notice: str,
    log_format: LogFormat,
    run: _Run,
) -> None:
    async with Orchestrator(config) as orchestrator:
        run.startup = anyio.CancelScope()  # a signal while the pool warms ends the warm-up
        with run.startup:
            await _warm_pool(orchestrator)
        run.server = _Server(
            build_app(orchestrator, keys, host=host, limits=limits),
            limits=limits,
            lifespan="on",
            log_level="info",
            log_config=uvicorn_log_config(log_format),
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        )
        limit_log_rate()  # after uvicorn's Config has set up its loggers
        # A signal that came while the orchestrator started: serve nothing, just tear down.
        run.server.should_exit = bool(run.received)
        url = _url(listener)
        typer.echo(f"sandhold: listening on {url} (REST /v1, OpenAPI /openapi.json, MCP /mcp)")
        typer.echo(f"sandhold: {notice}")
        summary = orchestrator.last_reconcile.summary()
        typer.echo(f"sandhold: registry {config.registry_path}: {summary}")
        await run.server.serve(sockets=[listener])
        stopped_id = orchestrator.orchestrator_id
    if config.on_shutdown == "persist":
        log.info("stopped: the sessions of orchestrator %s are left for the next start", stopped_id)
    else:
        log.info("stopped: no session of orchestrator %s is left", stopped_id)


async def _warm_pool(orchestrator: Orchestrator) -> None:
    """Wait for the warm pool to fill, showing how far it got (a live bar on a terminal, one
    line at the end otherwise); give up waiting after ``POOL_STALL_TIMEOUT`` without progress."""
    size = sum(status["size"] for status in orchestrator.pool_status().values())
    if not size:
        return
    columns = (
        TextColumn("warming the pool"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=stderr, disable=not stderr.is_terminal) as progress:
        task = progress.add_task("pool", total=size)
        ready, progressed = 0, anyio.current_time()
        while ready < size:
            if anyio.current_time() - progressed > POOL_STALL_TIMEOUT:
                log.warning("pool: %d of %d ready; serving, it goes on filling", ready, size)
                break
            await anyio.sleep(POOL_POLL_INTERVAL)
            got = sum(status["ready"] for status in orchestrator.pool_status().values())
            if got > ready:
                ready, progressed = got, anyio.current_time()
                progress.update(task, completed=ready)
    if not stderr.is_terminal:
        typer.echo(f"sandhold: warm pool: {ready} of {size} session(s) ready", err=True)
