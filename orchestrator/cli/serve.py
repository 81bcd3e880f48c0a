"""``sandhold serve``: the HTTP API (REST under /v1, OpenAPI, SSE) and MCP streamable HTTP at /mcp,
on one address, for the tenants of a tenants file or else one local tenant.

The port is bound before anything slow happens, so a taken port fails at once; then the image is
built if missing, the orchestrator started, ``--pool`` sessions of the default policy warmed
(with a progress display on stderr), and the address printed (with the local tenant's key
when it was just made: it is shown only that once, and kept mode 0600 in the data directory).

Stopping: the first Ctrl-C or SIGTERM stops accepting requests, lets those in flight finish
for ``GRACEFUL_SHUTDOWN_TIMEOUT``, then tears down every session this server created (shielded,
bounded by the orchestrator's shutdown timeout); a second one cuts the wait for requests short,
never the teardown. A signal before serving began cancels the start-up.

Reloading: SIGHUP reads the policies and the tenants file again, without dropping a session or a
connection: new sessions get the policies as they now are, live ones keep theirs; a key added
by ``sandhold tenant add`` works and one replaced by ``rotate`` stops working. A file that does
not validate is refused (logged, and printed on stdout) and the old settings stay.

Settings: ``--config FILE`` holds any of the options (``cli._serve_config``); an option given on
the command line or through its environment variable overrides the file.

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
import functools
import logging
import os
import resource
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
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
from orchestrator.cli._serve_config import ServeSettings, resolve_settings
from orchestrator.cli.image import with_image
from orchestrator.cli.tenant import default_tenants_file
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.http import HttpLimitsConfig, HttpServer, build_app, limit_log_rate
from orchestrator.policy.arguments import check_policy_name
from orchestrator.policy.model import load_policy

__all__ = ["serve"]

log = logging.getLogger("orchestrator.cli.serve")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RELOAD_SIGNAL = signal.SIGHUP
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
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A TOML file of these options (host, port, policy, tenants, pool, data_dir, "
            "...; unknown keys refused); options given here override it.",
        ),
    ] = None,
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
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDHOLD_DATA_DIR",
            help="The data directory (local key, registry, tenants.toml); default: "
            "$XDG_DATA_HOME/sandhold, else ~/.local/share/sandhold.",
        ),
    ] = None,
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
    with reported_errors():
        sources = {name: ctx.get_parameter_source(name) for name in ctx.params}
        settings = resolve_settings(config_file, ctx.params, sources)
    configure_logging(settings.log_format)
    with reported_errors():
        plan = _plan(settings)
        with plan.listener:
            stopped_by = anyio.run(_serve_until_stopped, plan)
    if stopped_by is not None:
        raise typer.Exit(128 + stopped_by)


@dataclasses.dataclass
class _Plan:
    """What serving needs, decided before anything slow happens."""

    config: OrchestratorConfig
    keys: TenantKeys
    tenants: Path | None
    limits: HttpLimitsConfig
    listener: socket.socket
    host: str
    notice: str
    log_format: LogFormat


def _plan(settings: ServeSettings) -> _Plan:
    if settings.data_dir is not None:  # for everything that reads it: keys, registry, tenants
        os.environ["SANDHOLD_DATA_DIR"] = str(settings.data_dir)
    policy = settings.policy
    config = OrchestratorConfig.from_env(**({"default_policy": policy} if policy else {}))
    load_policy(config.default_policy, search_dirs=config.policy_dirs)  # fail before a build
    if settings.pool:
        config = _with_pool(config, settings.pool)
    tenants = _tenants_file(settings.tenants)
    keys, notice = _keys(tenants)
    limits = _within_descriptors(
        HttpLimitsConfig(
            max_connections=settings.max_connections,
            max_connections_per_client=min(
                settings.max_connections_per_client, settings.max_connections
            ),
            header_timeout=settings.header_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
            auth_failures_per_minute=settings.auth_failures_per_minute,
            max_streams_per_tenant=settings.max_streams_per_tenant,
        )
    )
    registry = settings.registry or config.registry_path or data_dir() / "registry.db"
    config = dataclasses.replace(
        config,
        registry_path=registry,
        on_shutdown="persist" if settings.keep_sessions else "destroy",
        max_sessions=settings.max_sessions,
        tenants=keys.tenants if tenants is not None else {},
    )
    listener = _listen(settings.host, settings.port)
    return _Plan(
        config, keys, tenants, limits, listener, settings.host, notice, settings.log_format
    )


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
    # Set while serving: what SIGHUP does.
    reload: Callable[[], Awaitable[None]] | None = None


async def _serve_until_stopped(plan: _Plan) -> int | None:
    """Serve until a stop signal (its number is returned); the signal receiver stays open until
    the teardown has ended, so no second signal can kill the process halfway through it."""
    run = _Run(startup=anyio.CancelScope())
    with anyio.open_signal_receiver(*STOP_SIGNALS, RELOAD_SIGNAL) as signals:
        async with anyio.create_task_group() as group:
            group.start_soon(_stop_on_signals, signals, run)
            with run.startup:
                plan.config = await with_image(plan.config)
            if not run.received:
                await _serve(plan, run)
            group.cancel_scope.cancel()
    return run.received[0] if run.received else None


async def _stop_on_signals(signals: AsyncIterator[signal.Signals], run: _Run) -> None:
    async for signum in signals:
        if signum == RELOAD_SIGNAL:
            if run.reload is None:
                log.warning("SIGHUP while not serving: nothing reloaded")
            else:
                await run.reload()
            continue
        run.received.append(signum)
        log.info("stopping on %s", signal.Signals(signum).name)
        if run.server is None:
            run.startup.cancel()
        elif run.server.should_exit:
            run.server.force_exit = True
        else:
            run.server.should_exit = True


async def _serve(plan: _Plan, run: _Run) -> None:
    config, limits = plan.config, plan.limits
    async with Orchestrator(config) as orchestrator:
        run.startup = anyio.CancelScope()  # a signal while the pool warms ends the warm-up
        with run.startup:
            await _warm_pool(orchestrator)
        run.server = _Server(
            build_app(orchestrator, plan.keys, host=plan.host, limits=limits),
            limits=limits,
            lifespan="on",
            log_level="info",
            log_config=uvicorn_log_config(plan.log_format),
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        )
        limit_log_rate()  # after uvicorn's Config has set up its loggers
        # A signal that came while the orchestrator started: serve nothing, just tear down.
        run.server.should_exit = bool(run.received)
        url = _url(plan.listener)
        typer.echo(f"sandhold: listening on {url} (REST /v1, OpenAPI /openapi.json, MCP /mcp)")
        typer.echo(f"sandhold: {plan.notice}")
        summary = orchestrator.last_reconcile.summary()
        typer.echo(f"sandhold: registry {config.registry_path}: {summary}")
        run.reload = functools.partial(_reload, plan, orchestrator)
        try:
            await run.server.serve(sockets=[plan.listener])
        finally:
            run.reload = None
        stopped_id = orchestrator.orchestrator_id
    if config.on_shutdown == "persist":
        log.info("stopped: the sessions of orchestrator %s are left for the next start", stopped_id)
    else:
        log.info("stopped: no session of orchestrator %s is left", stopped_id)


async def _reload(plan: _Plan, orchestrator: Orchestrator) -> None:
    """SIGHUP: the tenants file and the policies read again; all of it or, when a file does not
    validate, none of it."""
    try:
        keys = TenantKeys.from_file(plan.tenants) if plan.tenants is not None else None
        await orchestrator.reload(tenants=keys.tenants if keys is not None else None)
    except OrchestratorError as exc:
        log.error("reload refused, the settings in use stay: %s", exc)
        typer.echo(f"sandhold: reload refused: {' '.join(str(exc).split())}")
        return
    what = "policies"
    if keys is not None:
        plan.keys.replace_with(keys)
        what += f" and {len(keys.tenants)} tenant(s) from {plan.tenants}"
    log.info("reloaded %s", what)
    typer.echo(f"sandhold: reloaded {what}")


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
