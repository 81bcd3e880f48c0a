"""What ``sandhold serve`` does once its options are read (``cli.serve`` has them and the whole
story: start-up, stopping, reloading, restarts, limits): plan what serving needs before
anything slow happens, then build the image, start the orchestrator, warm the pool and serve
until a stop signal."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import logging
import os
import resource
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator._api import Orchestrator
from orchestrator._core import (
    LOCAL_KEY_FILE,
    LOCAL_TENANT,
    OrchestratorConfig,
    TenantKeys,
    data_dir,
    local_tenant,
)
from orchestrator.cli._common import stderr
from orchestrator.cli._logging import LogFormat, uvicorn_log_config
from orchestrator.cli._serve_config import ServeSettings
from orchestrator.cli.image import with_image
from orchestrator.cli.tenant import default_tenants_file
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.http import (
    Front,
    FrontDoor,
    HttpLimitsConfig,
    HttpServer,
    build_app,
    limit_log_rate,
)
from orchestrator.policy.model import load_policy

__all__ = ["plan_serving", "serve_until_stopped"]

# The command's logger, whatever module of it speaks.
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
    e2b_listener: socket.socket | None = None


def plan_serving(settings: ServeSettings) -> _Plan:
    if settings.data_dir is not None:  # for everything that reads it: keys, registry, tenants
        os.environ["SANDHOLD_DATA_DIR"] = str(settings.data_dir)
    policy = settings.policy
    config = OrchestratorConfig.from_env(
        backend=settings.backend_config(), **({"default_policy": policy} if policy else {})
    )
    load_policy(config.default_policy, search_dirs=config.policy_dirs)  # fail before a build
    config = config.with_default_pool(settings.pool, settings.pool_idle)
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
    e2b_listener = None
    if settings.e2b_port is not None:
        if importlib.util.find_spec("connectrpc") is None:
            listener.close()
            raise InvalidArgumentError(
                "--e2b-port needs the e2b extra: pip install 'sandhold[e2b]'"
            )
        try:
            e2b_listener = _listen(settings.host, settings.e2b_port)
        except BaseException:
            listener.close()
            raise
    return _Plan(
        config, keys, tenants, limits, listener, settings.host, notice, settings.log_format,
        e2b_listener,
    )  # fmt: skip


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
    would re-raise a caught SIGTERM after serving, killing the process before the teardown).
    It serves only an app behind the front door (``orchestrator.http.FrontDoor``): keys,
    budgets, body bounds and stream limits hold on every port, a port added later included."""

    def __init__(self, app: Any, **options: Any) -> None:
        if not isinstance(app, FrontDoor):
            raise TypeError(f"serve serves apps behind the front door only, not {app!r}")
        super().__init__(app, **options)

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


async def serve_until_stopped(plan: _Plan) -> int | None:
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
        # One front for both ports: a wrong key costs its address on either, and a tenant's
        # streams are counted together.
        front = Front(
            plan.keys,
            limits=limits,
            metrics=orchestrator.metrics,
            audit=lambda: orchestrator.audit_log,
        )
        run.server = _Server(
            build_app(orchestrator, plan.keys, host=plan.host, limits=limits, front=front),
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
        typer.echo(
            f"sandhold: listening on {url} (REST /v1, OpenAPI /openapi.json, MCP /mcp, "
            "operations page /ui)"
        )
        typer.echo(f"sandhold: {plan.notice}")
        summary = orchestrator.last_reconcile.summary()
        typer.echo(f"sandhold: registry {config.registry_path}: {summary}")
        run.reload = functools.partial(_reload, plan, orchestrator)
        try:
            async with _e2b_serving(plan, orchestrator, front) as e2b:
                await run.server.serve(sockets=[plan.listener])
                if e2b is not None:
                    e2b.should_exit = True
        finally:
            run.reload = None
        stopped_id = orchestrator.orchestrator_id
    if config.on_shutdown == "persist":
        log.info("stopped: the sessions of orchestrator %s are left for the next start", stopped_id)
    else:
        log.info("stopped: no session of orchestrator %s is left", stopped_id)


@contextlib.asynccontextmanager
async def _e2b_serving(
    plan: _Plan, orchestrator: Orchestrator, front: Front
) -> AsyncIterator[_Server | None]:
    """E2B's protocol on its own port beside the main one, while the main one serves (the
    caller tells it to stop when the main one has); nothing without ``--e2b-port``."""
    if plan.e2b_listener is None:
        yield None
        return
    from orchestrator.http.e2b import build_e2b_app  # needs connectrpc: only when asked for

    server = _Server(
        build_e2b_app(orchestrator, plan.keys, front=front),
        limits=plan.limits,
        lifespan="on",
        log_level="info",
        log_config=uvicorn_log_config(plan.log_format),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
    )
    async with anyio.create_task_group() as group:
        group.start_soon(functools.partial(server.serve, sockets=[plan.e2b_listener]))
        typer.echo(f"sandhold: E2B protocol on {_url(plan.e2b_listener)} (docs/e2b.md)")
        try:
            yield server
        finally:
            server.should_exit = True


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
