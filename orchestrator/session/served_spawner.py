"""The session's served process spawner (``worker/spawner.py``): one long-lived attached exec
that starts the session's terminals, so a command costs a line on an open stream (well under a
millisecond of engine time) instead of a ``docker exec`` of its own (60-100 ms).

Each process it starts is handed out as a ``SpawnedStream``, which speaks the ``ExecStream``
protocol (``receive``/``send``/``send_eof``/``aclose``) so a terminal pumps it as it would an
exec's, plus what only a spawned process has: its ``exit_code``, ``resize`` and ``signal``
through the spawner, with no exec.

Invariants:
- One spawner per session, started on the first command (it exits after
  ``SPAWNER_IDLE_TIMEOUT`` with nothing running and nothing asked), read by one pump task (in
  the task group of the terminals that use it); the pump dispatches replies by request id and
  events by pid, and drops whatever matches neither (a late line, or one forged by code in the
  sandbox, which runs as the same user).
- Everything it says is untrusted: lines are bounded (``LineBuffer``), decoded strictly and
  checked against a model (``_Reply``, ``_Output``, ``_Exit``); a line too long or malformed
  ends the spawner as a lost one.
- A spawner that ends (killed, crashed, out of step) costs its own processes only: each of
  their streams ends with no exit code, their process groups are killed (they would outlive a
  spawner killed by SIGKILL), every request waiting on it fails, and the next ``start``
  starts a fresh spawner.
- A process's output waits in its stream's queue (``QUEUE_CHUNKS``) until its terminal's pump
  takes it; the terminal's buffer bounds its memory.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.backend.base import STDERR, STDOUT, Backend, ExecSpec, ExecStream
from orchestrator.errors import (
    BackendError,
    InvalidArgumentError,
    OrchestratorError,
    ProcessCrashedError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.session.helper_exchange import SEND_CHUNK_BYTES, STDERR_TAIL_BYTES, stderr_hint
from orchestrator.session.repl.protocol import LineBuffer, ProtocolViolation, untrusted_json
from orchestrator.session.signals import signal_process_group_quietly

__all__ = ["SPAWNER_ARGV", "ServedSpawner", "SpawnedStream"]

# A spawner with no process and no request for this long exits (~9 MiB of the session's memory
# back); an agent's commands come seconds apart, and after a pause the next pays one exec.
SPAWNER_IDLE_TIMEOUT: Final = 60.0
SPAWNER_ARGV: Final = (
    "python3",
    "-I",
    "/opt/sandhold/worker/spawner.py",
    f"{SPAWNER_IDLE_TIMEOUT:g}",
)
# 64 random bits: a request id nobody in the sandbox can guess before it is on its way.
ID_BYTES: Final = 8
# The spawner sends at most 32 KiB of output per line, base64 and JSON around it: ~44 KiB.
MAX_LINE_BYTES: Final = 256 * 1024
# A reply is a few lines of the spawner's own work (a fork, an ioctl): past this it is stuck.
REPLY_TIMEOUT: Final = 10.0
# Output chunks a process's stream holds before the pump waits for its terminal to take them.
QUEUE_CHUNKS: Final = 64
# A pid of the container's own namespace (the kernel's largest pid_max).
MAX_PID: Final = 2**22


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Reply(_Line):
    id: str = Field(max_length=64)
    ok: bool
    pid: int | None = Field(default=None, gt=1, lt=MAX_PID)
    found: bool | None = None
    error_type: str | None = Field(default=None, max_length=64)
    error_message: str | None = Field(default=None, max_length=4096)


class _Output(_Line):
    ev: str = Field(pattern="^out$")
    pid: int = Field(gt=1, lt=MAX_PID)
    data: str = Field(max_length=MAX_LINE_BYTES)


class _Exit(_Line):
    ev: str = Field(pattern="^exit$")
    pid: int = Field(gt=1, lt=MAX_PID)
    code: int = Field(ge=0, le=255)


class SpawnedStream:
    """One process started by the spawner, as an ``ExecStream`` (its output on ``STDOUT``,
    stdout and stderr merged as written)."""

    def __init__(self, spawner: _Connection, pid: int) -> None:
        self.pid = pid
        self.exec_id = f"spawned-{pid}"
        self.exit_code: int | None = None
        self._spawner = spawner
        self._send: MemoryObjectSendStream[bytes]
        self._receive: MemoryObjectReceiveStream[bytes]
        self._send, self._receive = anyio.create_memory_object_stream[bytes](QUEUE_CHUNKS)

    async def receive(self) -> tuple[int, bytes] | None:
        try:
            return STDOUT, await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    async def send(self, data: bytes) -> None:
        for start in range(0, len(data), SEND_CHUNK_BYTES):
            chunk = base64.b64encode(data[start : start + SEND_CHUNK_BYTES]).decode()
            await self._spawner.request("input", pid=self.pid, data=chunk)

    async def send_eof(self) -> None:
        await self._spawner.request("eof", pid=self.pid)

    async def resize(self, *, rows: int, cols: int) -> None:
        await self._spawner.request("resize", pid=self.pid, rows=rows, cols=cols)

    async def signal(self, number: int) -> bool:
        """Send signal ``number`` to the process's group; True when the group was there."""
        reply = await self._spawner.request("signal", pid=self.pid, signal=number)
        return reply.found is not False

    async def aclose(self) -> None:
        self._receive.close()
        self._spawner.forget(self.pid)

    async def _deliver(self, data: bytes) -> None:
        # Its terminal may be gone: then nobody reads this output.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._send.send(data)

    def _end(self, exit_code: int | None) -> None:
        self.exit_code = exit_code
        self._send.close()


class _Connection:
    """One running spawner: its exec stream, the requests awaiting replies, its processes."""

    def __init__(self, stream: ExecStream, backend: Backend, container_id: str) -> None:
        self.stream = stream
        self.backend = backend
        self.container_id = container_id
        self.lines = LineBuffer(MAX_LINE_BYTES)
        self.waiting: dict[str, tuple[anyio.Event, list[_Reply]]] = {}
        self.processes: dict[int, SpawnedStream] = {}
        # Each started process, by the id of the request that started it: its exit may be
        # dispatched (and it gone from ``processes``) before its starter runs again.
        self.started: dict[str, SpawnedStream] = {}
        self.stderr = b""
        self.ended = False
        self.send_lock = anyio.Lock()

    async def request(self, op: str, request_id: str | None = None, **fields: Any) -> _Reply:
        """Send ``op`` and wait for its reply: its payload, or the error its refusal names."""
        if self.ended:
            raise InvalidArgumentError("the process has ended (its spawner is gone)")
        request_id = request_id or secrets.token_hex(ID_BYTES)
        event, slot = anyio.Event(), list[_Reply]()
        self.waiting[request_id] = (event, slot)
        line = json.dumps({"id": request_id, "op": op, **fields}).encode() + b"\n"
        try:
            with anyio.fail_after(REPLY_TIMEOUT):
                async with self.send_lock:
                    await self.stream.send(line)
                await event.wait()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.ended = True  # its pump finds the end too; no request goes to it meanwhile
            raise self._crashed(op) from None
        except TimeoutError:
            raise BackendError(f"the process spawner did not answer {op}") from None
        finally:
            self.waiting.pop(request_id, None)
        if not slot:
            raise self._crashed(op)
        return _judged(op, slot[0])

    async def start(self, fields: Mapping[str, Any]) -> SpawnedStream:
        """Start a process; its stream, handed over by the reply's dispatch."""
        request_id = secrets.token_hex(ID_BYTES)
        try:
            await self.request("start", request_id=request_id, **fields)
            process = self.started.get(request_id)
        finally:
            self.started.pop(request_id, None)
        if process is None:
            raise BackendError("the process spawner started a process it did not name")
        return process

    def forget(self, pid: int) -> None:
        self.processes.pop(pid, None)

    def _crashed(self, op: str) -> ProcessCrashedError:
        hint = stderr_hint(self.stderr)
        return ProcessCrashedError(
            f"the session's process spawner ended before it answered {op}"
            + (f" ({hint})" if hint else ""),
            cause="the process spawner ended",
        )

    async def pump(self) -> None:
        """Read the spawner until it ends, then end everything that depended on it."""
        try:
            while (chunk := await self.stream.receive()) is not None:
                if chunk[0] == STDERR:
                    self.stderr = (self.stderr + chunk[1])[-STDERR_TAIL_BYTES:]
                    continue
                for line in self.lines.feed(chunk[1]):
                    await self._dispatch(line)
        except (OrchestratorError, ProtocolViolation, OSError, anyio.BrokenResourceError):
            pass  # a lost spawner: its processes end below, the next start makes a new one
        finally:
            self.ended = True
            for event, _ in list(self.waiting.values()):
                event.set()
            orphans = list(self.processes.values())
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()
                # A spawner killed with SIGKILL leaves what it started running, reparented:
                # they are killed before they are reported ended (one short exec each, on
                # this path only).
                for process in orphans:
                    await signal_process_group_quietly(
                        self.backend, self.container_id, process.pid, "KILL"
                    )
            for process in orphans:
                process._end(None)

    async def _dispatch(self, line: bytes) -> None:
        try:
            data = untrusted_json(line)
        except ValueError:
            raise ProtocolViolation("a spawner line is not JSON") from None
        if not isinstance(data, dict):
            raise ProtocolViolation("a spawner line is not a JSON object")
        try:
            if "id" in data:
                reply = _Reply.model_validate(data)
                waiter = self.waiting.get(reply.id)
                if waiter is not None and not waiter[0].is_set():
                    if reply.ok and reply.pid is not None:  # registered before any output
                        spawned = SpawnedStream(self, reply.pid)
                        self.processes[reply.pid] = self.started[reply.id] = spawned
                    waiter[1].append(reply)
                    waiter[0].set()
            elif data.get("ev") == "out":
                output = _Output.model_validate(data)
                if (process := self.processes.get(output.pid)) is not None:
                    await process._deliver(base64.b64decode(output.data, validate=True))
            else:
                ended = _Exit.model_validate(data)
                if (process := self.processes.pop(ended.pid, None)) is not None:
                    process._end(ended.code)
        except (ValidationError, binascii.Error) as exc:
            raise ProtocolViolation(f"a malformed spawner line: {str(exc)[:200]}") from None


class ServedSpawner:
    """The session's spawner, started on demand in ``task_group`` (which runs its pump)."""

    def __init__(self, backend: Backend, container_id: str) -> None:
        self._backend = backend
        self._container_id = container_id
        self._current: _Connection | None = None
        self._start_lock = anyio.Lock()
        self._closed = False

    async def spawn(
        self,
        task_group: anyio.abc.TaskGroup,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        pty: tuple[int, int] | None,
    ) -> SpawnedStream:
        """Start ``argv`` (its process group's leader) and return its stream. A spawner that
        was already running and ends before it answers (killed meanwhile) is replaced and asked
        once more; one started for this request that ends is ``process_crashed``."""
        fields = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": cwd,
            "pty": list(pty) if pty else None,
        }
        fresh = self._current is None or self._current.ended
        connection = await self._connection(task_group)
        try:
            return await connection.start(fields)
        except ProcessCrashedError:
            if fresh:
                raise
            connection = await self._connection(task_group)
            return await connection.start(fields)

    async def aclose(self) -> None:
        """Close the spawner's stream: it reads EOF and kills what it started. Shielded."""
        self._closed = True
        current, self._current = self._current, None
        if current is not None:
            with anyio.CancelScope(shield=True):
                await current.stream.aclose()

    async def _connection(self, task_group: anyio.abc.TaskGroup) -> _Connection:
        """The running spawner, or a fresh one when there is none (or it ended)."""
        async with self._start_lock:
            if self._closed:
                raise SessionNotFoundError("this session's process spawner is closed")
            if self._current is None or self._current.ended:
                stream = await self._backend.open_exec(
                    self._container_id, ExecSpec(argv=list(SPAWNER_ARGV))
                )
                self._current = _Connection(stream, self._backend, self._container_id)
                task_group.start_soon(self._current.pump)
            return self._current


def _judged(op: str, reply: _Reply) -> _Reply:
    if reply.ok:
        return reply
    message = (reply.error_message or "refused")[:4096]
    if reply.error_type == "invalid_argument":
        raise InvalidArgumentError(message)
    if reply.error_type == "quota_exceeded":
        raise QuotaExceededError(message)
    raise BackendError(f"the process spawner failed {op}: {message}")
