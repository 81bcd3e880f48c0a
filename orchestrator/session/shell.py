"""The persistent shell of a session: one long-lived bash that runs commands one at a time and
keeps the working directory, variables, functions and aliases between them.

Framing. bash reads its commands from the exec's stdin (pipes, no PTY). Each call sends two lines:

    { eval $'<the command, every byte but [A-Za-z0-9] written as \\xHH>'; } </dev/null 2>&1
    printf '\\n%s:%s:%s:%s\\n' TOKEN "$?" "$PWD" TOKEN

The command travels as one quoted literal, so nothing in it can end the line or pass for framing.
A call's own ``env`` goes before ``eval`` as assignments (``NAME=$'...' eval ...``): bash keeps
them, exported, for that one command and then restores what was there, while ``cd`` and
``export`` of other names still last. The session's env is the shell's own, from its start.
A brace group does not fork, so ``cd`` and ``export`` last; stdin is /dev/null, so the command
cannot eat the shell's next lines; stderr joins stdout. TOKEN is fresh and random per call and
still unread by bash while the command runs (bash reads a pipe a line at a time), so output that
looks like a status line is just output.

Interrupts. The shell is interactive (``-i``, no line editing, empty prompts, no history) for one
reason: interactive bash answers SIGINT by abandoning the command line in progress, loops
included, and reading the next one, as at a keyboard; a non-interactive bash would exit. At the
timeout the shell's process group gets SIGINT (Docker makes the exec's process a group leader; with
no job control, everything it runs stays in that group), then a second status line with a new
token follows, which the shell reaches however it dealt with the first. If no status line comes
back within the policy's kill grace, the group is SIGKILLed and the next call starts a fresh shell.
The same happens when the shell ends by itself (``exit``) and when a call is cancelled mid-command;
each time the result says ``shell_restarted`` (after ``exit`` the output ends with bash's own
"exit", as at a keyboard).

Invariants: calls are serialised by one lock; at most ``policy.output.max_stream_bytes`` of output
is kept (the rest is counted, ``truncated``); the shell's own stderr (prompts, job notices) is
discarded.
"""

from __future__ import annotations

import contextlib
import secrets
import string
from collections.abc import Mapping

import anyio
from pydantic import BaseModel, ConfigDict

from orchestrator.backend.base import STDOUT, WORKSPACE, Backend, ExecSpec, ExecStream
from orchestrator.errors import BackendError, OrchestratorError, SessionNotFoundError
from orchestrator.policy.arguments import check_timeout
from orchestrator.policy.commands import enforce
from orchestrator.policy.env import check_env, merged_env
from orchestrator.policy.model import Policy
from orchestrator.session.signals import signal_process_group

__all__ = ["PersistentShell"]

SHELL_ARGV = ("bash", "--noprofile", "--norc", "--noediting", "-i")
SETUP = "set +H +o history; unset HISTFILE PROMPT_COMMAND; PS0=; PS1=; PS2=; PS4=+\n"
# A fresh bash in a running container answers in milliseconds; past this the engine is stuck.
START_TIMEOUT = 10.0
# Two tokens, an exit status and a cwd of at most PATH_MAX: anything longer is not ours.
MAX_STATUS_BYTES = 8 * 1024
# How long a dying shell's exit code may take to show up at the engine.
EXIT_CODE_TIMEOUT = 5.0
TOKEN_BYTES = 16
# What a status line may say (the shell's own, or what code in the container wrote in its place).
MAX_PID = 2**22
MAX_EXIT_STATUS = 255
# One signal exec and closing a socket; bounded so teardown never hangs on a stuck engine.
CLOSE_TIMEOUT = 20.0
_PLAIN = frozenset((string.ascii_letters + string.digits).encode())


class ShellRunResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stdout: str
    exit_code: int | None
    cwd: str
    timed_out: bool = False
    shell_restarted: bool = False
    truncated: bool = False


class _ShellLost(Exception):
    """The shell's output ended: it exited or was killed."""


class _Framer:
    """Splits the shell's stdout into one command's output (bounded) and the status lines that
    end it, for the tokens it is told to expect."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.output = bytearray()
        self.total = 0
        self.statuses: dict[str, tuple[bytes, bytes]] = {}
        self._tokens: list[str] = []
        self._pending = b""

    def expect(self, token: str) -> None:
        self._tokens.append(token)

    def feed(self, data: bytes) -> None:
        pending = self._pending + data
        while True:
            hit = self._first_status(pending)
            if hit is None:
                keep = max(len(t) for t in self._tokens) + 2
                self._emit(pending[: max(len(pending) - keep, 0)])
                pending = pending[max(len(pending) - keep, 0) :]
                break
            index, token = hit
            start = index + len(token) + 2
            end = pending.find(b":" + token.encode() + b"\n", start)
            self._emit(pending[:index])
            if end < 0:
                if len(pending) - index > MAX_STATUS_BYTES:
                    raise BackendError("the shell wrote a malformed status line")
                pending = pending[index:]
                break
            status, _, cwd = pending[start:end].partition(b":")
            self.statuses[token] = (status, cwd)
            pending = pending[end + len(token) + 2 :]
        self._pending = pending

    def flush(self) -> None:
        """The output has ended without a status line: what was held back is output."""
        self._emit(self._pending)
        self._pending = b""

    def _first_status(self, data: bytes) -> tuple[int, str] | None:
        found = [
            (index, token)
            for token in self._tokens
            if token not in self.statuses
            and (index := data.find(b"\n" + token.encode() + b":")) >= 0
        ]
        return min(found) if found else None

    def _emit(self, data: bytes) -> None:
        if self.statuses or not data:
            return  # after the first status line, only status lines matter
        self.total += len(data)
        self.output += data[: max(self.cap - len(self.output), 0)]


class _Shell:
    def __init__(self, stream: ExecStream, pid: int) -> None:
        self.stream = stream
        self.pid = pid


class PersistentShell:
    def __init__(self, backend: Backend, container_id: str, policy: Policy) -> None:
        self._backend = backend
        self._container_id = container_id
        self._policy = policy
        self._shell: _Shell | None = None
        self._lock = anyio.Lock()
        self._closed = False
        # The session's env (checked when the session was made): the shell starts with it.
        self.session_env: Mapping[str, str] = {}

    async def run(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        confirm_dangerous: bool = False,
    ) -> ShellRunResult:
        """Run ``command`` in the shell if the shell policy allows it, with ``env`` over the
        session's for this command only; at ``timeout_s`` (the policy's default without one) it
        is interrupted, and the shell replaced if it does not come back."""
        command = enforce(command, self._policy, confirm_dangerous=confirm_dangerous)
        timeout = check_timeout(timeout_s, self._policy)
        extra = check_env(env, self._policy)
        merged_env(self.session_env, extra)  # within the bounds, as any exec's
        async with self._lock:
            if self._closed:
                raise SessionNotFoundError("this session's shell is closed")
            shell = self._shell or await self._start()
            try:
                return await self._run(shell, command, timeout, extra)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._discard()
                raise

    async def aclose(self) -> None:
        """Kill the shell and everything it runs; shielded, bounded, idempotent."""
        self._closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
            await self._discard()

    async def _start(self) -> _Shell:
        spec = ExecSpec(argv=SHELL_ARGV, env=dict(self.session_env))
        stream = await self._backend.open_exec(self._container_id, spec)
        shell = _Shell(stream, 0)
        self._shell = shell
        try:
            token = secrets.token_hex(TOKEN_BYTES)
            framer = _Framer(MAX_STATUS_BYTES)
            framer.expect(token)
            await stream.send((SETUP + _status_line(token, '"$$"')).encode())
            with anyio.fail_after(START_TIMEOUT):
                await _read_until(shell, framer, token)
            pid = _number(framer.statuses[token][0], 2, MAX_PID)
            if pid is None:
                raise ValueError("the shell gave no pid")
            shell.pid = pid
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._discard()
            if isinstance(exc, _ShellLost | ValueError):
                raise BackendError("the session's shell did not start") from exc
            raise
        return shell

    async def _run(
        self, shell: _Shell, command: str, timeout: float, env: Mapping[str, str]
    ) -> ShellRunResult:
        token = secrets.token_hex(TOKEN_BYTES)
        framer = _Framer(self._policy.output.max_stream_bytes)
        framer.expect(token)
        try:
            await _send(shell, _command_line(command, env) + _status_line(token))
            with anyio.move_on_after(timeout) as scope:
                await _read_until(shell, framer, token)
            if scope.cancelled_caught and not await self._interrupt(shell, framer):
                await self._discard()
                return self._result(framer, None, timed_out=True, restarted=True)
        except _ShellLost:
            exit_code = await self._exit_code(shell)
            await self._discard()
            return self._result(framer, exit_code, timed_out=False, restarted=True)
        status, cwd = next(iter(framer.statuses.values()))
        exit_code = _number(status, 0, MAX_EXIT_STATUS)
        return self._result(framer, exit_code, cwd=cwd, timed_out=scope.cancelled_caught)

    async def _interrupt(self, shell: _Shell, framer: _Framer) -> bool:
        """SIGINT the command, then ask for a second status line; False if none comes back
        within the kill grace."""
        probe = secrets.token_hex(TOKEN_BYTES)
        framer.expect(probe)
        await signal_process_group(self._backend, self._container_id, shell.pid, "INT")
        await _send(shell, _status_line(probe))
        with anyio.move_on_after(self._policy.timeouts.kill_grace_s):
            await _read_until(shell, framer, probe)
            return True
        return False

    def _result(
        self,
        framer: _Framer,
        exit_code: int | None,
        *,
        cwd: bytes = WORKSPACE.encode(),
        timed_out: bool,
        restarted: bool = False,
    ) -> ShellRunResult:
        framer.flush()
        return ShellRunResult(
            stdout=framer.output.decode("utf-8", "replace"),
            exit_code=exit_code,
            cwd=cwd.decode("utf-8", "replace"),
            timed_out=timed_out,
            shell_restarted=restarted,
            truncated=framer.total > framer.cap,
        )

    async def _exit_code(self, shell: _Shell) -> int | None:
        with contextlib.suppress(OrchestratorError):
            return await self._backend.wait_exec_exit(
                shell.stream.exec_id, timeout=EXIT_CODE_TIMEOUT
            )
        return None

    async def _discard(self) -> None:
        shell, self._shell = self._shell, None
        if shell is None:
            return
        if shell.pid:
            with contextlib.suppress(OrchestratorError):
                await signal_process_group(self._backend, self._container_id, shell.pid, "KILL")
        await shell.stream.aclose()


def _number(text: bytes, low: int, high: int) -> int | None:
    """A status field as a number in [low, high]: ASCII digits only, else None."""
    if not text.isdigit() or len(text) > len(str(high)):
        return None
    value = int(text)
    return value if low <= value <= high else None


async def _send(shell: _Shell, text: str) -> None:
    try:
        await shell.stream.send(text.encode())
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        raise _ShellLost from exc


async def _read_until(shell: _Shell, framer: _Framer, token: str) -> None:
    while token not in framer.statuses:
        chunk = await shell.stream.receive()
        if chunk is None:
            raise _ShellLost
        if chunk[0] == STDOUT:
            framer.feed(chunk[1])


def _quoted(text: str) -> str:
    """``text`` as a bash ANSI-C literal in which every byte but [A-Za-z0-9] is ``\\xHH``."""
    return "".join(chr(b) if b in _PLAIN else f"\\x{b:02x}" for b in text.encode())


def _command_line(command: str, env: Mapping[str, str] | None = None) -> str:
    # Names are checked variable names (check_env): only values need quoting.
    assignments = "".join(f"{name}=$'{_quoted(value)}' " for name, value in (env or {}).items())
    return f"{{ {assignments}eval $'{_quoted(command)}'; }} </dev/null 2>&1\n"


def _status_line(token: str, value: str = '"$?"') -> str:
    return f"printf '\\n%s:%s:%s:%s\\n' {token} {value} \"$PWD\" {token}\n"
