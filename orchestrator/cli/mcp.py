"""``sandhold mcp``: the sandbox tools over MCP on stdin/stdout, for an agent that spawns sandhold.

Nothing but MCP frames goes to stdout; logs and image build progress go to stderr. EOF on stdin,
Ctrl-C, SIGTERM and SIGHUP all end serving the same way: every session this server created is torn
down (shielded and bounded by the orchestrator's shutdown timeout) before the process exits, and
further signals during that teardown are absorbed rather than cutting it short.

Settings from the environment: those of ``OrchestratorConfig.from_env`` (``SANDHOLD_IMAGE``,
``SANDHOLD_ORCHESTRATOR_ID``, ``SANDHOLD_EXTRA_LABELS``, ...); ``--policy`` wins over
``SANDHOLD_POLICY``; ``SANDHOLD_POOL`` and ``SANDHOLD_POOL_IDLE`` for ``--pool`` and
``--pool-idle``: a warm pool of the default policy (2 sessions unless told, filled in the
background, drained after ``--pool-idle`` seconds without a take), as ``sandhold serve`` keeps.

``--connect URL`` (or ``SANDHOLD_CONNECT``) serves no sessions of its own: it forwards every call to
the ``sandhold serve`` at URL (``orchestrator.mcp_server.forward``) with ``--key`` /
``SANDHOLD_API_KEY`` (default: the local tenant's key in the data directory) and ``--task`` /
``SANDHOLD_TASK``, so sessions outlive this process. It needs no engine and no image; EOF and the
stop signals end it at once. With only those options it starts without typer
(``orchestrator.cli._front``): a client may start one such process per call.

The first frame is read before anything slow is imported, and an ``initialize`` is answered at
once (``orchestrator.mcp_server.handshake``); the imports that serving needs are made inside the
functions that serve, and the orchestrator starts while the client lists the tools.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.abc
import typer

from orchestrator.cli._common import reported_errors
from orchestrator.cli._pool_options import DEFAULT_POOL_IDLE, PoolIdleOption, PoolOption
from orchestrator.errors import InvalidArgumentError

if TYPE_CHECKING:
    from orchestrator._api import Orchestrator
    from orchestrator._core import OrchestratorConfig
    from orchestrator.mcp_server.handshake import EarlyAnswer
    from orchestrator.tools import ToolResult

__all__ = ["mcp"]

log = logging.getLogger("orchestrator.cli.mcp")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A client sends its first request as soon as it has spawned the server; if none has come by
# then, the orchestrator starts anyway (a call waits for it either way).
FIRST_REQUEST_WAIT = 2.0


def mcp(
    policy: Annotated[
        str | None,
        typer.Option(
            help="Default policy (name or file) for sessions a call does not name one for."
        ),
    ] = None,
    connect: Annotated[
        str | None,
        typer.Option(
            envvar="SANDHOLD_CONNECT",
            help="Forward every call to the `sandhold serve` at this URL (sessions outlive this "
            "process); the set-up for clients that start a server per call.",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            envvar="SANDHOLD_API_KEY",
            help="API key for --connect (default: the local tenant's, from the data directory).",
        ),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            envvar="SANDHOLD_TASK", help="With --connect: the task every call is made for."
        ),
    ] = None,
    pool: PoolOption = None,
    pool_idle: PoolIdleOption = DEFAULT_POOL_IDLE,
    tools: Annotated[
        str,
        typer.Option(
            envvar="SANDHOLD_TOOLS",
            help="Tool set to list: `all` (every tool and operation) or `agent` (execute, "
            "shell run, files read/write/list, session create: a list a third the size).",
        ),
    ] = "all",
) -> None:
    """Serve the sandbox tools over MCP (stdio) until stdin ends or a signal stops it."""
    from orchestrator.mcp_server.handshake import answer_initialize_early

    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s"
    )
    logging.getLogger("orchestrator").setLevel(logging.INFO)
    with reported_errors():
        if connect and policy:
            raise InvalidArgumentError("--policy does not apply with --connect: name one per call")
        if connect and tools != "all":
            raise InvalidArgumentError(
                "--tools does not apply with --connect: the server lists its tools"
            )
        # Before anything slow is imported: the client is answered while the rest loads.
        early = answer_initialize_early()
        if connect:
            from orchestrator.cli._front import forward

            stopped_by = forward(connect, key, task, early)
        else:
            serve = _serving(policy, early, pool, pool_idle, tools)
            stopped_by = anyio.run(_serve_until_stopped, serve)
    if stopped_by is not None:
        raise typer.Exit(128 + stopped_by)


def _serving(
    policy: str | None, early: EarlyAnswer, pool: int | None, pool_idle: float, tools: str
) -> Callable[[], Awaitable[None]]:
    from orchestrator._core import OrchestratorConfig
    from orchestrator.policy.model import load_policy
    from orchestrator.tools import tool_set

    tool_set(tools)  # an unknown set fails here, naming the sets there are
    config = OrchestratorConfig.from_env(**({"default_policy": policy} if policy else {}))
    config = config.side_by_side("mcp", adopt=True).with_default_pool(pool, pool_idle)
    load_policy(config.default_policy, search_dirs=config.policy_dirs)  # fail before a build
    return lambda: _serve(config, early, tools)


async def _serve_until_stopped(serve: Callable[[], Awaitable[None]]) -> int | None:
    """Serve until EOF (None) or a stop signal (its number); the signal receiver stays open until
    teardown has ended, so a second SIGTERM cannot kill the process halfway through it."""
    received: list[int] = []
    failure: list[Exception] = []
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    received.append(signum)
                    group.cancel_scope.cancel()
                    log.info("stopping on %s", signal.Signals(signum).name)

            group.start_soon(stop_on_signal)
            try:
                await serve()
            except Exception as exc:  # re-raised below, outside the task group's exception group
                failure.append(exc)
            group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return received[0] if received else None


async def _serve(config: OrchestratorConfig, early: EarlyAnswer, tools: str) -> None:
    """Answer ``initialize`` first, then start the orchestrator while the client lists tools:
    calls wait for it. A failed start ends serving with its error, as before serving began."""
    from orchestrator.mcp_server.server import serve_stdio

    starting = _Starting()
    answered = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(_run_orchestrator, config, starting, answered)
        await serve_stdio(
            starting, tenant=config.tenant, tools=tools, answered=answered, early=early
        )
        log.info("stdin closed")
        starting.stop()


class _Starting:
    """The orchestrator of this server, as calls see it: they wait until it has started."""

    def __init__(self) -> None:
        self._ready = anyio.Event()
        self._stopped = anyio.Event()
        self._orchestrator: Orchestrator | None = None

    async def call(self, tool: Any, arguments: Any, **options: Any) -> ToolResult:
        await self._ready.wait()
        assert self._orchestrator is not None
        return await self._orchestrator.call(tool, arguments, **options)

    def started(self, orchestrator: Orchestrator) -> None:
        self._orchestrator = orchestrator
        self._ready.set()

    def stop(self) -> None:
        self._stopped.set()

    async def until_stopped(self) -> None:
        await self._stopped.wait()


async def _run_orchestrator(
    config: OrchestratorConfig, starting: _Starting, answered: anyio.Event
) -> None:
    # The client's first request comes right after it spawned us; its answer goes first, and
    # the imports below run in a thread so that answer is never held behind them.
    with anyio.move_on_after(FIRST_REQUEST_WAIT):
        await answered.wait()
    await anyio.to_thread.run_sync(_import_orchestrator)
    from orchestrator._api import Orchestrator
    from orchestrator.cli.image import with_image

    config = await with_image(config)
    async with Orchestrator(config) as orchestrator:
        log.info("serving MCP on stdio (orchestrator %s)", orchestrator.orchestrator_id)
        starting.started(orchestrator)
        await starting.until_stopped()
    log.info("stopped: no session of orchestrator %s is left", orchestrator.orchestrator_id)


def _import_orchestrator() -> None:
    # Slow (pydantic models, the image builder ``with_image`` uses and with it the Docker SDK):
    # imported off the event loop, see above.
    import orchestrator._api
    import orchestrator.images  # noqa: F401
