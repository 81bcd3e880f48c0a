"""``sandhold mcp --connect URL`` started without the command-line framework: a client that starts
a server per call (langchain-mcp-adapters' ``get_tools()``) pays the process's start-up on every
call, and typer with rich is most of what is left of it once the MCP SDK is gone (issue 32;
bench/mcp_connect.py). Standard library only, with ``mcp_server.forward``.

``front_options(argv, environ)`` recognises exactly ``mcp`` with ``--connect``, ``--key`` and
``--task`` (``--name value`` or ``--name=value``) and their environment variables; any other
argument (``--help``, ``--policy``, a typo) returns None and the command goes through typer,
which parses, helps and refuses as for every command. ``forward(...)`` is the one forwarding
loop, used by both ways in.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.mcp_server.handshake import EarlyAnswer

__all__ = ["FrontOptions", "forward", "front_options", "run_front"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_ERROR = 2  # as orchestrator.cli._common: an sandhold error ends a command with 2
# Each option of the front and the environment variable that stands in for it.
OPTIONS = {"--connect": "SANDHOLD_CONNECT", "--key": "SANDHOLD_API_KEY", "--task": "SANDHOLD_TASK"}

# ``sandhold mcp --tools``'s variable: a tool set other than the whole is no option of the front.
TOOLS_VARIABLE = "SANDHOLD_TOOLS"

log = logging.getLogger("orchestrator.cli.mcp")


@dataclass(frozen=True)
class FrontOptions:
    connect: str
    key: str | None
    task: str | None


def front_options(argv: Sequence[str], environ: Mapping[str, str]) -> FrontOptions | None:
    """The options of ``sandhold mcp --connect ...`` in ``argv`` (the arguments after the program
    name), or None when ``argv`` is anything else."""
    if not argv or argv[0] != "mcp":
        return None
    given: dict[str, str] = {}
    rest = list(argv[1:])
    while rest:
        name, equals, value = rest.pop(0).partition("=")
        if name not in OPTIONS or name in given:
            return None
        if not equals:
            if not rest:
                return None
            value = rest.pop(0)
        given[name] = value
    if environ.get(TOOLS_VARIABLE, "all") not in ("", "all"):
        return None  # typer refuses a tool set with --connect, in one place
    values = {name: given.get(name) or environ.get(env) or None for name, env in OPTIONS.items()}
    connect = values["--connect"]
    if connect is None:
        return None
    return FrontOptions(connect, values["--key"], values["--task"])


def run_front(options: FrontOptions) -> int:
    """Serve as ``sandhold mcp --connect`` does and answer the exit status."""
    from orchestrator.mcp_server.handshake import answer_initialize_early

    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s"
    )
    logging.getLogger("orchestrator").setLevel(logging.INFO)
    try:
        early = answer_initialize_early()
        stopped_by = forward(options.connect, options.key, options.task, early)
    except OrchestratorError as err:
        message = " ".join(str(err).split())
        print(f"error: {err.code}: {message}", file=sys.stderr)
        return EXIT_ERROR
    return 0 if stopped_by is None else 128 + stopped_by


def forward(url: str, key: str | None, task: str | None, early: EarlyAnswer) -> int | None:
    """Forward until EOF (None) or a stop signal (its number). Blocking, with no event loop: the
    front keeps nothing to tear down (sessions live in the server), so a signal ends it at once."""
    from orchestrator.mcp_server.forward import RemoteSandhold, serve_stdio_forwarding

    if not key:
        from orchestrator.cli.call import resolve_key  # the data directory's local key

        key = resolve_key(key)
    remote = RemoteSandhold(url, key=key, task=task)

    def stop(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    log.info("serving MCP on stdio, forwarding to %s", remote.endpoint)
    try:
        serve_stdio_forwarding(remote, early=early)
    except _Stopped as stopped:
        log.info("stopping on %s", signal.Signals(stopped.signum).name)
        return stopped.signum
    log.info("stdin closed")
    return None


class _Stopped(BaseException):
    """A stop signal arrived while forwarding (a BaseException: no handler on the way takes it
    for a failure of the work)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
