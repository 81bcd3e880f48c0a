"""One terminal: ``bash -c COMMAND`` in a session container (started by the session's spawner,
``spawn_terminal``, or an exec of its own, ``open_terminal``), its output and its state.

Each terminal is one exec as the sandbox user, with a PTY (one merged stream, input echoed,
job-control keys) or with pipes (stdout and stderr merged as they arrive, stdin closable). It
starts through a one-line wrapper, ``printf '%s\\n' "$$"; exec bash -c "$1"`` (with a PTY,
``stty`` sets its size first): its first line of output is the in-container pid of the exec's
process, and ``exec`` keeps that pid for the command, so it is the pgid that
``process_signals`` signals.

Invariants (``SessionTerminals`` owns the terminals and runs each one's ``pump`` in its task
group):
- A terminal is ``running`` until its exec's output ends, then ``exited`` with the exec's exit
  code; ``finish`` happens once, and closes the buffer so every waiting reader wakes.
- Its memory is its buffer, capped by the caller; a flood drops its own oldest output (reported
  as a gap) and touches nothing else.
- ``pump`` never raises an engine or stream error: a broken stream ends this terminal only.
- Input is serialised by ``input_lock``.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from orchestrator.backend.base import STDERR, Backend, ExecSpec, ExecStream
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidArgumentError,
    OrchestratorError,
)
from orchestrator.session.served_spawner import ServedSpawner, SpawnedStream
from orchestrator.session.terminal.args import ReadArgs, shorten
from orchestrator.session.terminal.models import (
    TerminalResult,
    TerminalState,
    TerminalStatus,
    WaitReason,
)
from orchestrator.session.terminal.output_buffer import OutputBuffer

__all__ = ["Terminal", "open_terminal", "spawn_terminal"]

# 128 bits: a terminal id is as good as a capability.
TERMINAL_ID_BYTES = 16
DEFAULT_PTY_SIZE = (24, 80)
PTY_TERM = "xterm-256color"
# The wrapper prints its pid before anything else; past this the engine is stuck.
START_TIMEOUT = 10.0
MAX_PID_LINE = 4096
# The kernel's largest pid_max: a larger "pid" is not the wrapper's.
MAX_PID = 2**22
# The engine records an exec's exit code a moment after its stream ends.
EXIT_CODE_TIMEOUT = 5.0

WRAPPER = 'printf "%s\\n" "$$"; exec bash -c "$1" bash'
# Docker starts a PTY at 0x0; the size is set before the command runs, so it never sees that.
PTY_WRAPPER = f"stty rows {DEFAULT_PTY_SIZE[0]} cols {DEFAULT_PTY_SIZE[1]} 2>/dev/null; {WRAPPER}"


@dataclass(eq=False, kw_only=True)
class Terminal:
    id: str
    use_pty: bool
    stream: ExecStream
    buffer: OutputBuffer
    pid: int
    state: TerminalState = "running"
    exit_code: int | None = None
    finished_at: float | None = None
    stdin_closed: bool = False
    input_lock: anyio.Lock = field(default_factory=anyio.Lock)
    done: anyio.Event = field(default_factory=anyio.Event)

    def finish(self, exit_code: int | None, now: float) -> None:
        if self.state == "exited":
            return
        self.state, self.exit_code, self.finished_at = "exited", exit_code, now
        self.buffer.close()
        self.done.set()

    async def wait_done(self, timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            await self.done.wait()
        return self.done.is_set()

    async def send_input(self, data: bytes, *, close: bool) -> None:
        """Write ``data`` to the command's input, then with ``close`` end it (pipes only)."""
        if close and self.use_pty:
            raise InvalidArgumentError(
                "close_stdin is refused on a PTY: its input and output are one device, and "
                "closing it would end the session's output too",
                hint='write the end-of-input key ("\\u0004", Ctrl-D) or interrupt/kill it',
            )
        async with self.input_lock:
            if self.state != "running" or self.stdin_closed:
                raise InvalidArgumentError(f"terminal {self.id} takes no more input ({self.state})")
            try:
                if data:
                    await self.stream.send(data)
                if close:
                    await self.stream.send_eof()
                    self.stdin_closed = True
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise InvalidArgumentError(f"terminal {self.id} has stopped reading input") from exc

    async def resize(self, backend: Backend, *, rows: int, cols: int) -> None:
        if not self.use_pty:
            raise InvalidArgumentError(f"terminal {self.id} has no PTY to resize")
        if self.state != "running":
            raise InvalidArgumentError(f"terminal {self.id} has exited")
        if isinstance(self.stream, SpawnedStream):
            await self.stream.resize(rows=rows, cols=cols)
            return
        try:
            await backend.exec_resize(self.stream.exec_id, rows=rows, cols=cols)
        except BackendUnavailableError:
            raise
        except BackendError as exc:
            if await backend.exec_exit_code(self.stream.exec_id) is None:
                raise
            raise InvalidArgumentError(f"terminal {self.id} has exited") from exc

    async def pump(self, backend: Backend, clock: Callable[[], float]) -> None:
        """Copy the exec's output into the buffer until it ends, then finish with its exit code."""
        exit_code: int | None = None
        try:
            with contextlib.suppress(OrchestratorError, OSError, anyio.BrokenResourceError):
                while (chunk := await self.stream.receive()) is not None:
                    self.buffer.append(chunk[1])
            if isinstance(self.stream, SpawnedStream):
                exit_code = self.stream.exit_code
            else:
                with contextlib.suppress(OrchestratorError):
                    exit_code = await backend.wait_exec_exit(
                        self.stream.exec_id, timeout=EXIT_CODE_TIMEOUT
                    )
        finally:
            await self.stream.aclose()
            self.finish(exit_code, clock())

    async def wait_for_output(self, args: ReadArgs, timeout_ms: int) -> TerminalResult:
        """``result`` once there is output after the cursor, the terminal ended, or time ran out."""
        cursor = {"since_seq": args.since_seq, "since_offset": args.since_offset}
        self.buffer.has_new(**cursor)  # a cursor past the end is refused before waiting
        reason: WaitReason = "timeout"
        if await self.buffer.wait(**cursor, timeout=timeout_ms / 1000):
            reason = "output" if self.buffer.has_new(**cursor) else "exited"
        return self.result(args, reason)

    def result(self, args: ReadArgs, reason: WaitReason | None) -> TerminalResult:
        got = self.buffer.read(
            since_seq=args.since_seq, since_offset=args.since_offset, max_bytes=args.max_bytes
        )
        text, omitted = shorten(got.data.decode("utf-8", "replace"), args.max_output_chars)
        return TerminalResult(
            terminal_id=self.id,
            state=self.state,
            exit_code=self.exit_code,
            use_pty=self.use_pty,
            output=text,
            next_seq=got.next_seq,
            next_offset=got.next_offset,
            gap=got.gap,
            dropped_bytes=got.dropped_bytes,
            dropped_chunks=got.dropped_chunks,
            has_more=got.has_more,
            truncated=got.has_more or omitted > 0,
            omitted_chars=omitted,
            wait_reason=reason,
        )

    def status(
        self,
        *,
        written_bytes: int = 0,
        signal: str | None = None,
        signal_sent: bool = False,
        escalated: bool = False,
    ) -> TerminalStatus:
        return TerminalStatus(
            terminal_id=self.id,
            state=self.state,
            exit_code=self.exit_code,
            use_pty=self.use_pty,
            stdin_closed=self.stdin_closed,
            written_bytes=written_bytes,
            signal=signal,
            signal_sent=signal_sent,
            escalated=escalated,
        )


async def open_terminal(
    backend: Backend,
    container_id: str,
    command: str,
    *,
    use_pty: bool,
    workdir: str,
    env: dict[str, str],
    max_buffer_bytes: int,
) -> Terminal:
    """Start ``command`` through the wrapper and read its pid; the stream is closed on failure.
    The caller owns the result: it must run its ``pump``, or kill it and close its stream."""
    if use_pty:
        env = {"TERM": PTY_TERM, **env}
    argv = ["bash", "-c", PTY_WRAPPER if use_pty else WRAPPER, "sandhold-terminal", command]
    spec = ExecSpec(argv=argv, tty=use_pty, env=env, workdir=workdir)
    stream = await backend.open_exec(container_id, spec)
    buffer = OutputBuffer(max_bytes=max_buffer_bytes)
    try:
        with anyio.fail_after(START_TIMEOUT):
            pid = await _read_pid(stream, buffer)
        if not pid:
            raise _start_failure(buffer, workdir)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
        raise
    return Terminal(
        id=f"term_{secrets.token_hex(TERMINAL_ID_BYTES)}",
        use_pty=use_pty,
        stream=stream,
        buffer=buffer,
        pid=pid,
    )


async def spawn_terminal(
    spawner: ServedSpawner,
    task_group: anyio.abc.TaskGroup,
    command: str,
    *,
    use_pty: bool,
    workdir: str,
    env: dict[str, str],
    max_buffer_bytes: int,
) -> Terminal:
    """``open_terminal``'s twin through the session's spawner: ``bash -c command`` started by
    the long-lived helper (no exec), its pid the group's, its output through its stream."""
    if use_pty:
        env = {"TERM": PTY_TERM, **env}
    stream = await spawner.spawn(
        task_group,
        ["bash", "-c", command],
        env=env,
        cwd=workdir,
        pty=DEFAULT_PTY_SIZE if use_pty else None,
    )
    return Terminal(
        id=f"term_{secrets.token_hex(TERMINAL_ID_BYTES)}",
        use_pty=use_pty,
        stream=stream,
        buffer=OutputBuffer(max_bytes=max_buffer_bytes),
        pid=stream.pid,
    )


async def _read_pid(stream: ExecStream, buffer: OutputBuffer) -> int:
    """The wrapper's first line, the pid; 0 if the exec failed before it (its message is then
    in ``buffer``). Anything that came with the line goes to ``buffer`` as output."""
    head = b""
    while b"\n" not in head and len(head) <= MAX_PID_LINE:
        chunk = await stream.receive()
        if chunk is None:
            break
        if chunk[0] == STDERR:
            buffer.append(chunk[1])
        else:
            head += chunk[1]
    line, newline, rest = head.partition(b"\n")
    text = line.strip(b"\r ")
    if not newline or not text.isdigit() or len(text) > 10 or not 1 < int(text) < MAX_PID:
        buffer.append(head)
        return 0
    buffer.append(rest)
    return int(text)


def _start_failure(buffer: OutputBuffer, workdir: str) -> OrchestratorError:
    """The error for an exec that failed before the wrapper ran; the engine's message is in
    ``buffer``."""
    buffer.close()
    message = buffer.read(max_bytes=MAX_PID_LINE).data.decode("utf-8", "replace").strip()
    if "chdir" in message:
        return InvalidArgumentError(f"cwd {workdir} is not a directory in the session")
    return BackendError(f"the terminal did not start: {message[:500]}")
