"""``sandhold shell``: your terminal attached to a shell in a new sandbox.

The shell is a PTY terminal running a login bash in a new session: a local orchestrator's (as
``sandhold run`` makes one), or a running ``sandhold serve``'s when ``--server`` is given, reached
through its HTTP API. Input goes in with ``terminal write``, output comes back with ``terminal
wait`` from a byte cursor, and the window size follows with ``terminal resize`` (at start and on
each SIGWINCH). The command exits with the shell's exit status.

When stdin is a terminal it is put in raw mode, so Ctrl-C, Ctrl-D, Tab and the arrow keys reach
the shell in the sandbox. Otherwise (a pipe, a file) the shell runs without line editing or echo,
input is forwarded once the shell has printed its first prompt (so the PTY does not echo it
before ``stty -echo`` ran), and its end is sent as Ctrl-D.

Invariants: the local terminal's mode is restored on every way out; the session is removed on
every way out (the local orchestrator's shielded teardown, or a shielded, bounded ``destroy`` on
the server); only the output loop may end the attachment with an error, the input and window
loops stop quietly when a call fails (the output loop then reports why).
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import functools
import os
import secrets
import signal
import sys
import termios
import tty
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any

import anyio
import typer

from orchestrator.cli._common import EXIT_ERROR, reported_errors, until_terminated
from orchestrator.cli.call import ServerClient, resolve_key, server_from_env
from orchestrator.cli.image import with_image
from orchestrator.errors import OrchestratorError

__all__ = ["Call", "CallFailedError", "Console", "attach", "shell"]

# ``exec``: the shell's exit status is the terminal's, with no bash -c in between.
SHELL_COMMAND = "exec bash --login -i"
# Without a terminal on our side nobody edits lines, the PTY's echo would double the input,
# and a pipe wants plain newlines.
PIPED_SHELL_COMMAND = "stty -echo -onlcr; exec bash --login --noediting -i"
DEFAULT_TERM = "xterm-256color"
# One ``terminal wait`` returns at the first output or after this long; then it is renewed.
WAIT_MS = 10_000
READ_BYTES = 4096
# Piped input waits for the shell's first output at most this long (a login shell's start-up).
FIRST_OUTPUT_TIMEOUT = 10.0
# What Ctrl-D sends: the end of input, for a shell reading at the start of a line.
END_OF_INPUT = "\x04"
# Removing the session on the server: one call, which should take a second or two.
TEARDOWN_TIMEOUT = 30.0

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class CallFailedError(Exception):
    """A terminal call the shell depends on failed; carries its structured result."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("error_message"))
        self.result = result


def shell(
    policy: Annotated[str | None, typer.Option(help="Policy of the new sandbox.")] = None,
    server: Annotated[
        str | None,
        typer.Option(
            help="Use a running `sandhold serve` (default: $SANDHOLD_URL, else run locally)."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            envvar="SANDHOLD_API_KEY", help="API key for --server (default: the local one)."
        ),
    ] = None,
) -> None:
    """Attach your terminal to a shell in a new sandbox; exits with the shell's exit status and
    removes the sandbox."""
    console = Console.of_process()
    start: dict[str, Any] = {
        "operation": "start",
        "command": SHELL_COMMAND if console.tty else PIPED_SHELL_COMMAND,
        "use_pty": True,
        "yield_time_ms": 0,
        "env": {"TERM": (os.environ.get("TERM") or DEFAULT_TERM) if console.tty else "dumb"},
    }
    if policy is not None:
        start["policy"] = policy
    server = server or server_from_env()
    with reported_errors():
        try:
            if server is None:
                status = anyio.run(_local, console, start)
            else:
                client = ServerClient(server, resolve_key(key))
                status = anyio.run(_remote, console, start, client)
        except CallFailedError as failed:
            message = " ".join(str(failed.result.get("error_message", "")).split())
            typer.echo(f"error: {failed.result.get('error_type')}: {message}", err=True)
            raise typer.Exit(EXIT_ERROR) from None
    raise typer.Exit(status)


async def _local(console: Console, start: dict[str, Any]) -> int:
    from orchestrator._api import Orchestrator, OrchestratorConfig

    config = OrchestratorConfig.from_env(orchestrator_id=f"sandhold-shell-{secrets.token_hex(4)}")
    config = config.side_by_side("shell", adopt=False)
    config = await with_image(config)
    async with Orchestrator(config) as orchestrator:

        async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return (await orchestrator.call(tool, arguments)).structured

        return await until_terminated(attach(call, console, start))


async def _remote(console: Console, start: dict[str, Any], client: ServerClient) -> int:
    async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        answer = await anyio.to_thread.run_sync(client.call, tool, arguments)
        return answer.result

    sessions: list[str] = []
    try:
        return await until_terminated(attach(call, console, start, started=sessions.append))
    finally:
        for session_id in sessions:
            with anyio.CancelScope(shield=True):
                destroy = {"operation": "destroy", "session_id": session_id}
                remove = functools.partial(client.call, timeout=TEARDOWN_TIMEOUT)
                try:
                    await anyio.to_thread.run_sync(remove, "python_repl", destroy)
                except OrchestratorError as exc:
                    typer.echo(f"warning: session {session_id} not removed: {exc}", err=True)


async def attach(
    call: Call,
    console: Console,
    start: dict[str, Any],
    *,
    started: Callable[[str], object] = lambda session_id: None,
) -> int:
    """Start the shell and attach ``console`` to it until it exits; its exit status."""
    first = _ok(await call("terminal", start))
    started(first["session_id"])
    terminal_id = first["terminal_id"]
    failure: list[Exception] = []
    shown = anyio.Event()
    with console.raw_mode():
        await console.write(first["output"], shown)
        await _resize(call, terminal_id, console)
        async with anyio.create_task_group() as group:
            group.start_soon(_forward_input, call, terminal_id, console, shown)
            if console.tty:
                group.start_soon(_follow_window, call, terminal_id, console)
            try:
                offset = first["next_offset"]
                status = await _forward_output(call, terminal_id, offset, console, shown)
            except Exception as exc:  # re-raised below, outside the task group's exception group
                failure.append(exc)
            group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return status


async def _forward_output(
    call: Call, terminal_id: str, offset: int, console: Console, shown: anyio.Event
) -> int:
    while True:
        wait = {
            "operation": "wait",
            "terminal_id": terminal_id,
            "since_offset": offset,
            "timeout_ms": WAIT_MS,
        }
        result = _ok(await call("terminal", wait))
        await console.write(result["output"], shown)
        offset = result["next_offset"]
        if result["state"] == "exited" and not result.get("has_more"):
            code = result.get("exit_code")
            return code if isinstance(code, int) else EXIT_ERROR


async def _forward_input(
    call: Call, terminal_id: str, console: Console, shown: anyio.Event
) -> None:
    if not console.tty:
        with anyio.move_on_after(FIRST_OUTPUT_TIMEOUT):
            await shown.wait()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        data = await console.read()
        text = decoder.decode(data, final=not data) + ("" if data else END_OF_INPUT)
        write = {"operation": "write", "terminal_id": terminal_id, "input_text": text}
        if not (await _quietly(call, "terminal", write)) or not data:
            return


async def _follow_window(call: Call, terminal_id: str, console: Console) -> None:
    with anyio.open_signal_receiver(signal.SIGWINCH) as changes:
        async for _ in changes:
            if not await _resize(call, terminal_id, console):
                return


async def _resize(call: Call, terminal_id: str, console: Console) -> bool:
    """Give the shell our window size (a no-op without one); whether the terminal took it."""
    size = console.window_size()
    if size is None:
        return True
    rows, cols = size
    resize = {"operation": "resize", "terminal_id": terminal_id, "rows": rows, "cols": cols}
    return await _quietly(call, "terminal", resize)


async def _quietly(call: Call, tool: str, arguments: dict[str, Any]) -> bool:
    """Whether the call succeeded; a failure is left for the output loop to report."""
    try:
        return bool((await call(tool, arguments)).get("success"))
    except OrchestratorError:
        return False


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    if not result.get("success"):
        raise CallFailedError(result)
    return result


@dataclasses.dataclass(frozen=True)
class Console:
    """Our side of the shell: the file descriptors we read input from and write output to."""

    stdin: int
    stdout: int
    tty: bool

    @classmethod
    def of_process(cls) -> Console:
        stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
        return cls(stdin, stdout, os.isatty(stdin))

    @contextlib.contextmanager
    def raw_mode(self) -> Iterator[None]:
        """Raw input while attached (keys reach the sandbox's shell as typed); the saved mode
        is restored on the way out, whichever way that is."""
        if not self.tty:
            yield
            return
        saved = termios.tcgetattr(self.stdin)
        tty.setraw(self.stdin, termios.TCSANOW)  # TCSANOW: keep what was typed ahead
        try:
            yield
        finally:
            termios.tcsetattr(self.stdin, termios.TCSADRAIN, saved)

    def window_size(self) -> tuple[int, int] | None:
        if not self.tty:
            return None
        try:
            size = os.get_terminal_size(self.stdin)
        except OSError:
            return None
        return (size.lines, size.columns) if size.lines and size.columns else None

    async def read(self) -> bytes:
        """What input there is, once there is some; b"" at its end."""
        # A regular file or /dev/null cannot be polled (EPERM), and never blocks a read.
        with contextlib.suppress(OSError):
            await anyio.wait_readable(self.stdin)
        return os.read(self.stdin, READ_BYTES)

    async def write(self, text: str, shown: anyio.Event) -> None:
        """Show the shell's output; ``shown`` is set once some was."""
        if text:
            data = text.encode("utf-8", "replace")
            await anyio.to_thread.run_sync(_write_all, self.stdout, data)
            shown.set()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
