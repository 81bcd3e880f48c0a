"""The python_repl side of a session: one worker at a time, with timeouts that tell the truth.

A timeout first interrupts the worker (SIGINT); if it answers within the kill grace its state is
kept (``state_reset: false``), otherwise it is SIGKILLed and replaced (``state_reset: true``). A
caller that is cancelled (a client's timeout, a dropped connection, a cancelled task) gets the
same treatment for its request before the cancel goes on, shielded and bounded, so the next call
finds the worker idle with its state. A worker that dies or breaks the protocol costs its state
and nothing else; the next request gets a fresh worker and is told so. Callers serialise requests
(the session lock), which they hold until the interrupt is done.

``interrupt()`` is the one call made without the session lock: it stops the cell another caller
runs (one whose client has gone without a cancel, as mcp 1.x clients do at their timeout) the way
a timeout does, SIGINT with the state kept, or after the kill grace a fresh worker; the cell's own
``execute`` answers as usual, and ``interrupts`` counts the cells stopped so.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict

from orchestrator.backend.base import Backend, ContainerState
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    ContainerNotFoundError,
    ProcessCrashedError,
)
from orchestrator.policy.model import Policy
from orchestrator.session.repl.cell_policy import CellRequest, check_cell
from orchestrator.session.repl.protocol import (
    ExecuteReply,
    InspectReply,
    ListVariablesReply,
    PreloadReply,
    ProtocolViolation,
    Reply,
    bundle_size,
    payload,
)
from orchestrator.session.repl.worker_process import (
    WORKER_ARGV,
    OutputListener,
    WorkerExited,
    WorkerProcess,
    kill_pid,
)

__all__ = [
    "FRAME_SLACK_BYTES",
    "ExecuteOutcome",
    "InterruptOutcome",
    "Repl",
    "result_budget",
    "worker_config",
]

log = logging.getLogger(__name__)

# Room around the policy's reply cap for JSON framing and the fixed fields.
FRAME_SLACK_BYTES = 64 * 1024
# What a reply's fixed fields take beside its streams and rich results (ids, times, flags, an
# error message and a traceback cut short).
REPLY_ENVELOPE_BYTES = 16 * 1024
# Re-adopting: reach the worker; if a cell holds it past the first wait, interrupt the cell
# (its answer has no reader) and reach it again.
ADOPT_READY_TIMEOUTS = (2.0, 10.0)
# A cell running longer than this has its container looked at every WATCH_INTERVAL.
WATCH_AFTER = 1.0
WATCH_INTERVAL = 1.0
# A worker idle this long is pinged before a cell is sent to it: one killed meanwhile is
# replaced, and the cell runs in the fresh one with ``state_reset``. Cells sent back to back
# skip the ping (half a millisecond of theirs).
IDLE_PROBE_AFTER = 1.0
# Introspection replies are small and fast; a worker that needs longer is stuck.
QUICK_OP_TIMEOUT = 10.0
# How long a ping may take to tell a frozen engine from a worker that failed to start: an engine
# that answers at all answers a ping in milliseconds.
ENGINE_CHECK_TIMEOUT = 5.0
# numpy, pandas, matplotlib and scipy import in a few seconds from a cold page cache.
PRELOAD_TIMEOUT = 120.0


class ContainerStopped(Exception):
    """The session's container is no longer running; the worker went with it."""

    def __init__(self, state: ContainerState) -> None:
        super().__init__(state.status)
        self.state = state


@dataclass(eq=False)
class _Cell:
    """The cell an ``execute`` is running: what ``interrupt()`` stops."""

    worker: WorkerProcess
    started: float  # monotonic
    done: anyio.Event = field(default_factory=anyio.Event)
    interrupted: bool = False


class InterruptOutcome(BaseModel):
    """What ``interrupt()`` did: whether a cell was running (and is now stopped), how long it
    had run, and whether its worker had to be replaced (its state lost)."""

    model_config = ConfigDict(frozen=True)

    interrupted: bool
    ran_for_s: float | None = None
    state_reset: bool = False


class ExecuteOutcome(BaseModel):
    """What one ``execute`` did, before the session adds its identity."""

    model_config = ConfigDict(frozen=True)

    success: bool
    stdout: str = ""
    stderr: str = ""
    # Bytes the code wrote to each stream, including what the caps cut away.
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    result_repr: str | None = None
    # Rich results, in the order the cell showed them: MIME bundles (see protocol.MIME_TYPES).
    results: list[dict[str, Any]] = []
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    violations: list[str] = []
    execution_time_ms: float = 0.0
    cpu_time_ms: float = 0.0
    peak_memory_mb: float = 0.0
    timed_out: bool = False
    state_reset: bool = False
    truncated: bool = False


def worker_config(policy: Policy) -> dict[str, Any]:
    python = policy.python
    return {
        "mode": python.mode,
        "allowed_modules": list(python.allowed_modules),
        "forbidden_modules": list(python.forbidden_modules),
        "forbidden_builtins": list(python.forbidden_builtins),
        "max_code_bytes": python.max_code_bytes,
        "max_stream_bytes": policy.output.max_stream_bytes,
        "max_reply_bytes": policy.output.max_reply_bytes,
        "max_repr_chars": policy.output.max_stream_bytes,
        "max_result_bytes": result_budget(policy),
        # The interpreter outlives a crash of the orchestrator; the next one re-adopts it.
        "persist": True,
    }


class Repl:
    def __init__(
        self,
        backend: Backend,
        container_id: str,
        policy: Policy,
        *,
        worker_argv: Sequence[str] = WORKER_ARGV,
        adopt_pid: int | None = None,
        on_new_worker: Callable[[int], None] | None = None,
        persist: bool = True,
        probe_after: float = IDLE_PROBE_AFTER,
    ) -> None:
        self._backend = backend
        # A persistent worker outlives its stream for the next orchestrator to re-adopt.
        self._persist = persist
        self._probe_after = probe_after
        self._container_id = container_id
        self._policy = policy
        self._worker_argv = worker_argv
        self._worker: WorkerProcess | None = None
        # A persistent worker left by an orchestrator before this one, reached on first use.
        self._adopt_pid = adopt_pid
        self._on_new_worker = on_new_worker
        # The session's env (Session.set_env): every worker of the session starts with it.
        self._session_env: dict[str, str] = {}
        # True once a worker with user state was lost; reported by the next execute.
        self._state_lost = False
        # True once a cell saw the container stop: the session is over, whatever else holds it.
        self.container_stopped = False
        # The cell being run, if any, and how many cells ``interrupt()`` has stopped.
        self._cell: _Cell | None = None
        self.interrupts = 0

    @property
    def worker_pid(self) -> int | None:
        if self._worker is not None and self._worker.alive:
            return self._worker.pid
        return self._adopt_pid

    async def start(self) -> None:
        await self._ensure_worker()

    async def _ensure_worker(self) -> WorkerProcess:
        if (self._worker is None or not self._worker.alive) and self._adopt_pid is not None:
            await self._adopt(self._adopt_pid)
        if self._worker is None or not self._worker.alive:
            try:
                self._worker = await WorkerProcess.start(
                    self._backend,
                    self._container_id,
                    {**worker_config(self._policy), "persist": self._persist},
                    max_frame=self._policy.output.max_reply_bytes + FRAME_SLACK_BYTES,
                    argv=self._worker_argv,
                    env=self._session_env,
                )
            except (ProtocolViolation, WorkerExited, TimeoutError) as exc:
                if isinstance(exc, TimeoutError) and not await self._engine_answers():
                    raise BackendUnavailableError(
                        "the engine stopped answering while the Python worker started",
                        hint="retry once the engine answers (its readiness: /readyz)",
                    ) from exc
                cause = str(exc) or "no ready frame in time"
                raise ProcessCrashedError("the Python worker failed to start", cause=cause) from exc
            if self._on_new_worker is not None:
                self._on_new_worker(self._worker.pid)
        return self._worker

    async def _engine_answers(self) -> bool:
        """Whether the engine answers a ping in time: a worker whose ready frame did not come
        behind a frozen or restarting engine is the engine's failure, not the worker's."""
        with anyio.move_on_after(ENGINE_CHECK_TIMEOUT):
            try:
                await self._backend.ping()
            except BackendError:
                return False
            return True
        return False

    async def _adopt(self, pid: int) -> None:
        """Reach the worker an earlier orchestrator left running. One still busy with a cell
        that orchestrator sent (no one waits for its answer any more) is interrupted, state
        kept, and reached again. One that cannot be reached (gone, stuck, or a stranger on its
        socket) is killed: its state is lost, which the next execute reports, and it never
        lingers as an orphan."""
        self._adopt_pid = None
        max_frame = self._policy.output.max_reply_bytes + FRAME_SLACK_BYTES
        for attempt, ready_timeout in enumerate(ADOPT_READY_TIMEOUTS):
            try:
                self._worker = await WorkerProcess.attach(
                    self._backend,
                    self._container_id,
                    pid,
                    max_frame=max_frame,
                    ready_timeout=ready_timeout,
                )
                return
            except TimeoutError:
                if attempt + 1 < len(ADOPT_READY_TIMEOUTS):
                    with contextlib.suppress(BackendError):
                        await kill_pid(self._backend, self._container_id, pid, "INT")
                    continue
                reason = "no ready frame, even after an interrupt"
            except (ProtocolViolation, WorkerExited) as exc:
                reason = str(exc)
            break
        log.info("worker %d in %s not re-adopted: %s", pid, self._container_id[:12], reason)
        self._state_lost = True
        with contextlib.suppress(BackendError):
            await kill_pid(self._backend, self._container_id, pid)

    def check(self, code: Any, timeout: Any = None, env: Any = None) -> CellRequest:
        """The cell as this REPL's policy allows it (``cell_policy``), or the refusal."""
        return check_cell(self._policy, code, timeout, env)

    async def execute(
        self,
        code: Any,
        *,
        timeout: Any = None,
        env: Any = None,
        on_output: OutputListener | None = None,
    ) -> ExecuteOutcome:
        """Run ``code`` for at most ``timeout`` seconds (None: the policy's ``command_s``; past
        its ``max_command_s``: ``invalid_argument``); ``env`` is set for this cell only, within
        the policy's env rules; with ``on_output``, its output also goes there as it comes
        (bounded by the stream caps: no more than the reply holds)."""
        request = self.check(code, timeout, env)
        limit = self._policy.python.max_code_bytes
        if len(request.code.encode("utf-8", "surrogatepass")) > limit:
            return _validation_failure(f"code is longer than the policy's {limit} bytes")
        worker = await self._ensure_worker()
        if time.monotonic() - worker.answered_at >= self._probe_after:
            worker = await self._alive(worker)
        cell = self._cell = _Cell(worker, time.monotonic())
        try:
            return await self._execute(
                request.code, cell, timeout=request.timeout, env=request.env, on_output=on_output
            )
        finally:
            self._cell = None
            cell.done.set()

    async def _execute(
        self,
        code: str,
        cell: _Cell,
        *,
        timeout: float,
        env: Mapping[str, str] | None,
        on_output: OutputListener | None,
    ) -> ExecuteOutcome:
        worker = cell.worker
        state_reset, self._state_lost = self._state_lost, False
        started = time.time()
        try:
            extra: dict[str, Any] = {}
            if env:
                extra["env"] = dict(env)
            if on_output is not None:
                extra["stream"] = True
                on_output = _capped(on_output, self._policy.output.max_stream_bytes)
            request_id = await worker.send("execute", code=code, **extra)
            try:
                reply = await self._reply_within(worker, request_id, timeout, on_output)
            except anyio.get_cancelled_exc_class():
                # No one will read this answer: end the cell now, as a timeout would.
                self._state_lost = self._state_lost or state_reset
                await self._interrupted_reply(worker, request_id)
                raise
            if reply is not None:
                return _outcome(reply, self._policy, state_reset=state_reset)
            return await self._interrupt(worker, request_id, state_reset=state_reset)
        except ContainerStopped as exc:
            await self._discard(worker)
            return _crash_outcome(await self._stop_cause(exc.state, started))
        except WorkerExited:
            if cell.interrupted:  # interrupt() replaced a worker that did not stop
                await self._discard(worker)
                return _interrupted_outcome()
            return await self._crashed(worker, started)
        except ProtocolViolation as exc:
            await self._discard(worker)
            return _crash_outcome(f"the worker broke the protocol: {exc}")
        except BackendUnavailableError:
            await self._lose_stream(worker)
            raise

    async def _alive(self, worker: WorkerProcess) -> WorkerProcess:
        """``worker`` if it answers a ping; else (killed while idle) a fresh one, the state lost
        and the next cell told so."""
        try:
            with anyio.fail_after(QUICK_OP_TIMEOUT):
                reply = await worker.request("ping")
            if reply.ok:
                return worker
        except BackendUnavailableError:
            await self._lose_stream(worker)
            raise
        except TimeoutError:
            # The stream runs through the engine: a frozen engine stalls the ping too, and
            # killing the worker then would be carried out once the engine thaws, its state lost.
            try:
                await self._backend.ping()
            except BackendUnavailableError:
                await self._lose_stream(worker)
                raise
            # The engine answers, maybe only now that it thawed (a freeze past the ping's
            # timeout but within the engine's): its stream flows again, and a worker that
            # answers now keeps its state. Only one that still does not is replaced.
            with contextlib.suppress(TimeoutError, WorkerExited, ProtocolViolation):
                try:
                    with anyio.fail_after(QUICK_OP_TIMEOUT):
                        if (await worker.request("ping")).ok:
                            return worker
                except BackendUnavailableError:
                    await self._lose_stream(worker)
                    raise
        except (WorkerExited, ProtocolViolation):
            pass
        await self._discard(worker)
        return await self._ensure_worker()

    async def _reply_within(
        self,
        worker: WorkerProcess,
        request_id: str,
        timeout: float,
        on_output: OutputListener | None = None,
    ) -> Reply | None:
        """The reply, or None at the timeout. A cell still running after ``WATCH_AFTER`` has its
        container watched each ``WATCH_INTERVAL``: a container that stopped (OOM, a fork bomb
        under gVisor, a kill from outside) does not always end the exec's stream, and the
        caller should hear about it now, not at its timeout. Reading is cancel-safe, so the
        wait is resumed between looks."""
        deadline = anyio.current_time() + timeout
        wait = min(timeout, WATCH_AFTER)
        while True:
            with anyio.move_on_after(wait):
                return await worker.receive_reply(request_id, on_output)
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return None
            state = await self._backend.container_state(self._container_id)
            if not state.running:
                self.container_stopped = True
                raise ContainerStopped(state)
            wait = min(remaining, WATCH_INTERVAL)

    async def _container_state(self) -> ContainerState | None:
        """The container's state; None once the engine no longer has it."""
        try:
            return await self._backend.container_state(self._container_id)
        except ContainerNotFoundError:
            return None

    async def _stop_cause(
        self, state: ContainerState, started: float, *, oom: bool | None = None
    ) -> str:
        if oom is None:
            oom = bool(
                await self._backend.oom_kills(
                    self._container_id, since=started - 1, until=time.time() + 0.2
                )
            )
        if oom or state.oom_killed:
            limit = self._policy.resources.memory_mb
            return f"OOM: its container was killed for exceeding {limit} MiB of memory"
        return f"its container stopped (status {state.status}, exit code {state.exit_code})"

    async def _lose_stream(self, worker: WorkerProcess) -> None:
        """The engine went away under the stream; the worker may well live on (and finish its
        cell). Let go of the stream and re-adopt the worker through a relay on the next call."""
        if worker.pid:
            self._adopt_pid = worker.pid
        self._worker = None
        await worker.detach()

    async def _interrupt(
        self, worker: WorkerProcess, request_id: str, *, state_reset: bool
    ) -> ExecuteOutcome:
        """A timed-out cell: interrupted with its state kept, or its worker replaced."""
        reply = await self._interrupted_reply(worker, request_id)
        if reply is not None:
            try:
                kept = _outcome(reply, self._policy, state_reset=state_reset)
            except ProtocolViolation:
                await self._discard(worker)
            else:
                return kept.model_copy(update=_timed_out_fields(state_reset=state_reset))
        return ExecuteOutcome(**_timed_out_fields(state_reset=True))

    async def _interrupted_reply(self, worker: WorkerProcess, request_id: str) -> Reply | None:
        """SIGINT, then the reply to ``request_id`` within the kill grace; without one the
        worker is SIGKILLed (its state lost, which the next execute reports) and this is None.
        Shielded, since it runs for callers that are being cancelled too, and bounded: the
        signal's exec has its own timeout, then the grace, then the kill's exec. A SIGINT that
        arrives after the request was answered finds the worker idle, which ignores it."""
        grace = self._policy.timeouts.kill_grace_s
        reply = None
        with anyio.CancelScope(shield=True):
            try:
                await worker.signal("INT")
                with anyio.move_on_after(grace):
                    reply = await worker.receive_reply(request_id)
            except (WorkerExited, ProtocolViolation, BackendError):
                pass
            if reply is None:
                await self._discard(worker)
        return reply

    async def interrupt(self) -> InterruptOutcome:
        """Stop the cell being run, if any, as a timeout does: SIGINT, then up to the kill grace
        for the cell to end (its state kept), else its worker is killed (the cell's ``execute``
        answers ``state_reset``). Shielded and bounded, like the timeout's interrupt."""
        cell = self._cell
        if cell is None:
            return InterruptOutcome(interrupted=False)
        cell.interrupted = True
        self.interrupts += 1
        ran_for_s = round(time.monotonic() - cell.started, 3)
        grace = self._policy.timeouts.kill_grace_s
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(WorkerExited, BackendError):
                await cell.worker.signal("INT")
            with anyio.move_on_after(grace):
                await cell.done.wait()
            if cell.done.is_set():
                return InterruptOutcome(interrupted=True, ran_for_s=ran_for_s)
            await self._discard(cell.worker)
            with anyio.move_on_after(grace):  # the execute sees its worker gone and answers
                await cell.done.wait()
        return InterruptOutcome(interrupted=True, ran_for_s=ran_for_s, state_reset=True)

    async def _crashed(self, worker: WorkerProcess, started: float) -> ExecuteOutcome:
        await self._discard(worker)
        cause = await self._crash_cause(worker, started)
        return _crash_outcome(cause)

    async def _crash_cause(self, worker: WorkerProcess, started: float) -> str:
        # The engine records the OOM event a moment after the process dies; by then a container
        # that went down with its worker (gVisor, an outside kill) has stopped too.
        oom = await self._backend.oom_kills(
            self._container_id, since=started - 1, until=time.time() + 0.2
        )
        state = await self._container_state()
        code = None
        if state is not None and state.running:
            with contextlib.suppress(ContainerNotFoundError):
                code = await worker.exit_code()
            if code is None:  # the exec may have gone with a container stopping as we looked
                state = await self._container_state()
        if state is None:
            self.container_stopped = True
            return "its container is gone"
        if not state.running:
            self.container_stopped = True
            return await self._stop_cause(state, started, oom=bool(oom))
        if oom:
            return f"OOM: killed for exceeding {self._policy.resources.memory_mb} MiB of memory"
        if code is not None and code > 128:
            try:
                return f"killed by {signal.Signals(code - 128).name}"
            except ValueError:
                return f"exited with status {code}"
        if code is not None:
            return f"exited with status {code}"
        return "the worker's stream ended"

    async def _discard(self, worker: WorkerProcess) -> None:
        self._state_lost = True
        await worker.kill()

    async def _quick(self, op: str, *, timeout: float = QUICK_OP_TIMEOUT, **args: Any) -> Reply:
        worker = await self._ensure_worker()
        try:
            request_id = await worker.send(op, **args)
            try:
                with anyio.fail_after(timeout):
                    reply = await worker.receive_reply(request_id)
            except anyio.get_cancelled_exc_class():
                # An inspect may be in a user __repr__: interrupted, as a cancelled cell is.
                await self._interrupted_reply(worker, request_id)
                raise
        except BackendUnavailableError:
            await self._lose_stream(worker)
            raise
        except (WorkerExited, ProtocolViolation, TimeoutError) as exc:
            await self._discard(worker)
            raise ProcessCrashedError(f"the worker failed during {op}", cause=str(exc)) from exc
        if not reply.ok:
            raise ProcessCrashedError(f"the worker refused {op}", cause=str(reply.error_message))
        return reply

    async def list_variables(self) -> ListVariablesReply:
        return payload(await self._quick("list_variables"), ListVariablesReply)

    async def inspect(self, name: str) -> InspectReply:
        return payload(await self._quick("inspect", name=name), InspectReply)

    async def set_env(self, env: Mapping[str, str]) -> None:
        """The session's env (checked by the caller): the running worker is told, and every
        worker started after it (a crash, a timeout, a reset) starts with it. An adopted worker
        was told by the orchestrator before, and keeps it."""
        self._session_env = dict(env)
        if self._session_env and self._worker is not None and self._worker.alive:
            await self._quick("set_env", env=self._session_env)

    async def preload(self, modules: Sequence[str]) -> PreloadReply:
        """Import ``modules`` in the worker before its first cell (a warm pool's sessions), into
        ``sys.modules`` and no namespace; the worker leaves out what the policy would refuse,
        and its import check of a cell still applies by name."""
        reply = await self._quick("preload", timeout=PRELOAD_TIMEOUT, modules=list(modules))
        return payload(reply, PreloadReply)

    async def reset(self) -> None:
        """A fresh worker: nothing of the old interpreter survives, not even imported modules."""
        if self._worker is not None:
            await self._worker.kill()
        self._worker = None
        self._state_lost = False
        await self._ensure_worker()

    async def detach(self) -> None:
        """Let go of the worker without killing it: it waits on its socket for a relay."""
        if self._worker is not None:
            await self._worker.detach()
            self._worker = None

    async def aclose(self) -> None:
        if self._worker is not None:
            await self._worker.kill()
            self._worker = None


def _capped(listener: OutputListener, limit: int) -> OutputListener:
    """``listener`` for at most ``limit`` characters per stream: the worker streams only what
    its reply keeps; one that streams more is lying, and the surplus goes nowhere. A listener
    that raises hears no more of this cell; the cell and its reply go on."""
    sent = {"stdout": 0, "stderr": 0}
    failed = False

    def forward(name: str, text: str) -> None:
        nonlocal failed
        room = limit - sent[name]
        if room <= 0 or failed:
            return
        sent[name] += min(len(text), room)
        try:
            listener(name, text[:room])
        except Exception:
            failed = True
            log.warning("an output listener raised; the rest of the cell's output is not streamed")

    return forward


def result_budget(policy: Policy) -> int:
    """Bytes a cell's rich results may take: the policy's figure, within what a reply leaves
    beside both streams at their cap."""
    output = policy.output
    room = output.max_reply_bytes - 2 * output.max_stream_bytes - REPLY_ENVELOPE_BYTES
    return max(min(output.max_result_bytes, room), 1)


def _outcome(reply: Reply, policy: Policy, *, state_reset: bool) -> ExecuteOutcome:
    if not reply.ok:
        raise ProtocolViolation(f"worker refused execute: {reply.error_message}")
    data = payload(reply, ExecuteReply)
    used = sum(bundle_size(bundle) for bundle in data.results)
    if used > result_budget(policy):
        raise ProtocolViolation(f"rich results of {used} bytes, over the worker's budget")
    fields = data.model_dump(exclude={"interrupted", "results_dropped"})
    return ExecuteOutcome(**fields, state_reset=state_reset)


def _timed_out_fields(*, state_reset: bool) -> dict[str, Any]:
    kept = "state kept" if not state_reset else "worker restarted, state lost"
    return {
        "success": False,
        "timed_out": True,
        "state_reset": state_reset,
        "error_type": "timeout",
        "error_message": f"execution timed out ({kept})",
    }


def _interrupted_outcome() -> ExecuteOutcome:
    return ExecuteOutcome(
        success=False,
        error_type="KeyboardInterrupt",
        error_message="interrupted by python_repl interrupt; the worker did not stop within the "
        "kill grace and was restarted (state lost)",
        state_reset=True,
    )


def _crash_outcome(cause: str) -> ExecuteOutcome:
    return ExecuteOutcome(
        success=False,
        error_type="process_crashed",
        error_message=f"the Python worker crashed: {cause}",
        state_reset=True,
    )


def _validation_failure(reason: str) -> ExecuteOutcome:
    return ExecuteOutcome(
        success=False, error_type="validation", error_message=reason, violations=[reason]
    )
