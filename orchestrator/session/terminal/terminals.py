"""Terminals: commands started in a session's container and read through cursors while they run.

``SessionTerminals`` keeps the terminals of one session: it checks arguments (``terminal_args``),
starts each command as a ``Terminal`` (``terminal_exec``: the exec, the pid wrapper, the output
buffer), runs its pump in the task group this object owns, and signals its process group
(``process_signals``). Callers read output through ``since_seq`` / ``since_offset`` cursors and
get the models of ``terminal_models``.

Invariants:
- Arguments are checked before anything starts: a bad one is invalid_argument, nothing changed.
- A terminal is ``running`` until its exec's output ends, then ``exited`` with the exec's exit
  code; it stays readable for ``retention_s`` (at most ``terminals_per_session`` finished ones are
  kept, oldest forgotten first), then its id is unknown.
- At most ``policy.limits.terminals_per_session`` terminals run or are starting at once.
- A terminal's memory is its buffer, capped at ``policy.output.max_stream_bytes``; a flood drops
  its own oldest output (reported as a gap) and touches nothing else.
- A pump never raises into the task group: a broken stream ends that terminal only.
- ``aclose`` kills every running process group, closes every stream and cancels the pumps;
  shielded, bounded, idempotent, callable from any task.
"""

from __future__ import annotations

import contextlib
import signal as signals
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self

import anyio
import anyio.abc

from orchestrator.backend.base import WORKSPACE, Backend
from orchestrator.errors import (
    InvalidArgumentError,
    OrchestratorError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.policy.arguments import check_flag, check_id, check_int
from orchestrator.policy.commands import enforce
from orchestrator.policy.env import check_env, merged_env
from orchestrator.policy.model import Policy
from orchestrator.session.paths import workspace_path
from orchestrator.session.served_spawner import ServedSpawner, SpawnedStream
from orchestrator.session.signals import (
    signal_name,
    signal_process_group,
    signal_process_group_quietly,
)
from orchestrator.session.terminal.args import (
    DEFAULT_WAIT_MS,
    DEFAULT_YIELD_MS,
    MAX_TERMINAL_SIZE,
    MAX_WAIT_MS,
    MAX_YIELD_MS,
    input_bytes,
    read_args,
    shorten,
)
from orchestrator.session.terminal.attached import Terminal, spawn_terminal
from orchestrator.session.terminal.models import TerminalResult, TerminalState, TerminalStatus

__all__ = [
    "SessionTerminals",
    "TerminalResult",
    "TerminalState",
    "TerminalStatus",
    "shorten",
    "signal_name",
    "signal_process_group",
]

# Long enough to come back for the output of a finished command, short enough to forget it.
TERMINAL_RETENTION_S = 600.0
# After SIGKILL the exec's stream ends as soon as the engine notices.
KILL_CONFIRM_TIMEOUT = 10.0
# How long to wait for a group to empty before killing it again.
KILL_RETRY_INTERVAL = 0.5
CLOSE_TIMEOUT = 20.0


class SessionTerminals:
    """The terminals of one session: ``async with SessionTerminals(...) as terminals``, or
    ``await task_group.start(terminals.serve)`` in a task group that outlives the session."""

    def __init__(
        self,
        backend: Backend,
        container_id: str,
        policy: Policy,
        *,
        retention_s: float = TERMINAL_RETENTION_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._container_id = container_id
        self._policy = policy
        self._retention_s = retention_s
        self._clock = clock
        self._terminals: dict[str, Terminal] = {}
        self._starting = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False
        self._host: anyio.abc.TaskGroup | None = None
        # Starts every command from one long-lived helper in the container (no exec each).
        self._spawner = ServedSpawner(backend, container_id)
        # The owning tenant's own terminals_per_session quota, when lower than the policy's.
        self.tenant_cap: int | None = None
        # Told each new terminal id, so the manager finds the session by it on every path.
        self.on_started: Callable[[str], None] | None = None
        # The session's env (checked when the session was made): every command gets it.
        self.session_env: Mapping[str, str] = {}

    async def __aenter__(self) -> Self:
        host = anyio.create_task_group()
        await host.__aenter__()
        self._host = host
        try:
            await host.start(self.serve)
        except BaseException as exc:
            self._host = None
            await host.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            await self.aclose()
        finally:
            host, self._host = self._host, None
            suppress = await host.__aexit__(exc_type, exc, tb) if host is not None else None
        return suppress

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the pumps until ``aclose`` (which ends this), for a caller with a long-lived task
        group; ``async with`` runs it in a task group of its own. The pumps live in a task of
        their own so that ``aclose`` can cancel them from any task, the caller's included."""
        if self._tg is not None or self._closed:
            raise RuntimeError("these terminals are already served, or closed")
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            await self.aclose()

    # -- operations ---------------------------------------------------------------------------

    async def start(
        self,
        command: str,
        *,
        use_pty: bool = True,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        yield_time_ms: int = DEFAULT_YIELD_MS,
        max_bytes: int | None = None,
        max_output_chars: int | None = None,
        confirm_dangerous: bool = False,
    ) -> TerminalResult:
        """Run ``bash -c command`` if the shell policy allows it, with the session's env and
        ``env`` over it; return at its first output, its end, or after yield_time_ms."""
        command = enforce(command, self._policy, confirm_dangerous=confirm_dangerous)
        pty = check_flag(use_pty, "use_pty")
        workdir = WORKSPACE if cwd is None else workspace_path(cwd, name="cwd")
        extra_env = merged_env(self.session_env, check_env(env, self._policy))
        timeout_ms = check_int(yield_time_ms, "yield_time_ms", 0, MAX_YIELD_MS)
        args = read_args(0, None, max_bytes, max_output_chars)
        self._reserve()
        try:
            term = await self._launch(command, pty, workdir, extra_env)
        finally:
            self._starting -= 1
        if self.on_started is not None:
            self.on_started(term.id)
        try:
            return await term.wait_for_output(args, timeout_ms)
        except BaseException:
            # The caller never saw the id: nobody could ever stop this command.
            with anyio.CancelScope(shield=True):
                await self._discard(term)
            raise

    async def read(
        self,
        terminal_id: str,
        *,
        since_seq: int | None = None,
        since_offset: int | None = None,
        max_bytes: int | None = None,
        max_output_chars: int | None = None,
    ) -> TerminalResult:
        """Output after the cursor (from the beginning without one), now."""
        args = read_args(since_seq, since_offset, max_bytes, max_output_chars)
        return self._get(terminal_id).result(args, None)

    async def wait(
        self,
        terminal_id: str,
        *,
        timeout_ms: int = DEFAULT_WAIT_MS,
        since_seq: int | None = None,
        since_offset: int | None = None,
        max_bytes: int | None = None,
        max_output_chars: int | None = None,
    ) -> TerminalResult:
        """``read``, once there is output after the cursor, the terminal ended, or time ran out."""
        wait_ms = check_int(timeout_ms, "timeout_ms", 0, MAX_WAIT_MS)
        args = read_args(since_seq, since_offset, max_bytes, max_output_chars)
        return await self._get(terminal_id).wait_for_output(args, wait_ms)

    async def write(
        self, terminal_id: str, input_text: str, *, close_stdin: bool = False
    ) -> TerminalStatus:
        """Send input; with pipes, ``close_stdin`` then ends the input (EOF)."""
        data = input_bytes(input_text)
        close = check_flag(close_stdin, "close_stdin")
        term = self._get(terminal_id)
        await term.send_input(data, close=close)
        return term.status(written_bytes=len(data))

    async def interrupt(self, terminal_id: str) -> TerminalStatus:
        """SIGINT to the terminal's process group, once; no escalation."""
        term = self._get(terminal_id)
        sent = term.state == "running" and await self._signal(term, "INT")
        return term.status(signal="INT", signal_sent=sent)

    async def kill(self, terminal_id: str, *, signal: str | int = "TERM") -> TerminalStatus:
        """Send ``signal`` to the process group; SIGKILL after the policy's kill grace."""
        name = signal_name(signal)
        term = self._get(terminal_id)
        sent = escalated = False
        if term.state == "running":
            sent = await self._signal(term, name)
            if not await term.wait_done(self._policy.timeouts.kill_grace_s) and name != "KILL":
                escalated = await self._signal(term, "KILL")
            await self._kill_stragglers(term)
        return term.status(signal=name, signal_sent=sent, escalated=escalated)

    async def _kill_stragglers(self, term: Terminal) -> None:
        """A child forked while the group was being killed escapes that one signal (a fork bomb
        makes this likely): KILL the group again until it is gone, within a bound."""
        with anyio.move_on_after(KILL_CONFIRM_TIMEOUT):
            while not await term.wait_done(KILL_RETRY_INTERVAL):
                await self._signal(term, "KILL")

    async def resize(self, terminal_id: str, rows: int, cols: int) -> TerminalStatus:
        height = check_int(rows, "rows", 1, MAX_TERMINAL_SIZE)
        width = check_int(cols, "cols", 1, MAX_TERMINAL_SIZE)
        term = self._get(terminal_id)
        await term.resize(self._backend, rows=height, cols=width)
        return term.status()

    async def aclose(self) -> None:
        """Kill every running command, close every stream, stop the pumps."""
        with anyio.CancelScope(shield=True):
            self._closed = True
            terms, self._terminals = list(self._terminals.values()), {}
            with anyio.move_on_after(CLOSE_TIMEOUT):
                async with anyio.create_task_group() as tg:
                    for term in terms:
                        if term.state == "running":
                            tg.start_soon(self._signal_quietly, term, "KILL")
            for term in terms:
                await term.stream.aclose()
            await self._spawner.aclose()
            if self._tg is not None:
                self._tg.cancel_scope.cancel()

    # -- internals ----------------------------------------------------------------------------

    def _task_group(self) -> anyio.abc.TaskGroup:
        if self._closed or self._tg is None:
            raise SessionNotFoundError("this session's terminals are closed (or not yet open)")
        return self._tg

    def _reserve(self) -> None:
        self._task_group()
        self._sweep()
        running = sum(1 for term in self._terminals.values() if term.state == "running")
        limit = self._policy.limits.terminals_per_session
        if self.tenant_cap is not None:
            limit = min(limit, self.tenant_cap)
        if running + self._starting >= limit:
            raise QuotaExceededError(
                f"terminals_per_session: {limit} terminals are already running in this session",
                hint="wait for one to finish, or kill one",
            )
        self._starting += 1

    async def _launch(
        self, command: str, use_pty: bool, workdir: str, env: dict[str, str]
    ) -> Terminal:
        term = await spawn_terminal(
            self._spawner,
            self._task_group(),
            command,
            use_pty=use_pty,
            workdir=workdir,
            env=env,
            max_buffer_bytes=self._policy.output.max_stream_bytes,
        )
        try:
            tg = self._task_group()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._discard(term)
            raise
        self._terminals[term.id] = term
        tg.start_soon(term.pump, self._backend, self._clock)
        return term

    def _get(self, terminal_id: object) -> Terminal:
        key = check_id(terminal_id, "terminal_id")
        self._sweep()
        term = self._terminals.get(key)
        if term is None:
            raise SessionNotFoundError("no such terminal in this session")
        return term

    def _sweep(self) -> None:
        """Forget finished terminals past retention, and the oldest beyond the count limit."""
        now = self._clock()
        finished = sorted(
            (t for t in self._terminals.values() if t.finished_at is not None),
            key=lambda t: t.finished_at or 0.0,
        )
        excess = len(finished) - self._policy.limits.terminals_per_session
        for index, term in enumerate(finished):
            if index < excess or now - (term.finished_at or now) >= self._retention_s:
                del self._terminals[term.id]

    async def _discard(self, term: Terminal) -> None:
        self._terminals.pop(term.id, None)
        if term.state == "running":
            await self._signal_quietly(term, "KILL")
        await term.stream.aclose()

    async def _signal(self, term: Terminal, name: str) -> bool:
        if isinstance(term.stream, SpawnedStream):
            try:
                return await term.stream.signal(signals.Signals[f"SIG{name}"].value)
            except InvalidArgumentError:  # ended meanwhile: no group left to signal
                return False
        return await signal_process_group(self._backend, self._container_id, term.pid, name)

    async def _signal_quietly(self, term: Terminal, name: str) -> None:
        if isinstance(term.stream, SpawnedStream):
            with contextlib.suppress(OrchestratorError), anyio.move_on_after(KILL_CONFIRM_TIMEOUT):
                await term.stream.signal(signals.Signals[f"SIG{name}"].value)
            return
        await signal_process_group_quietly(self._backend, self._container_id, term.pid, name)
