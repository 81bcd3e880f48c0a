"""One REPL worker as the orchestrator sees it: a long-lived exec in a session container, spoken to
in lockstep (one request, then its one reply) over the attached stream.

Invariants: the caller serialises requests (the session lock); every frame is decoded through
``protocol`` and anything unexpected raises ``ProtocolViolation``, after which the caller kills the
worker; reading is cancel-safe (partial frames stay buffered), so a timed-out wait can be resumed
after an interrupt; a request's write is shielded, so a cancel reaches its caller in the wait for
the reply; the reply to a request its caller gave up on is dropped by its id when it comes, never
taken for the reply of the request after it (an id never sent is still a violation); the
worker's own stderr is kept only as a bounded tail for diagnostics.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from orchestrator.backend.base import STDOUT, Backend, ExecSpec, ExecStream
from orchestrator.errors import BackendError
from orchestrator.session.repl.protocol import (
    PROTOCOL_VERSION,
    FatalFrame,
    LineBuffer,
    ProtocolViolation,
    ReadyFrame,
    Reply,
    StreamFrame,
    decode_frame,
    encode_request,
)

__all__ = ["WORKER_ARGV", "OutputListener", "WorkerExited", "WorkerProcess", "kill_pid"]

# Streamed output of a request: ("stdout" or "stderr", text). Called as frames are read, so it
# must be quick and must not block: a slow consumer queues what it gets.
OutputListener = Callable[[str, str], None]

WORKER_ARGV = ("python3", "-I", "/opt/sandhold/worker/repl_worker.py")
RELAY_ARGV = ("python3", "-I", "/opt/sandhold/worker/relay.py")
# The worker's pid is told by this shell before it execs the worker, i.e. before any untrusted
# code runs; the pid the worker itself reports is only checked against it.
PID_ANNOUNCER = ("/bin/sh", "-c", 'echo "sandhold-pid $$"; exec "$@"', "sandhold-worker")
_PID_LINE = re.compile(rb"^sandhold-pid ([0-9]{1,7})$")
# A cold interpreter in a fresh container is ready in well under a second; ten covers a loaded host.
READY_TIMEOUT = 10.0
# Signals go through a short exec of their own; the engine answers that in ~60 ms.
SIGNAL_TIMEOUT = 10.0
# A request is written while the worker waits for it (lockstep), so even a code cell of several
# MiB is taken in milliseconds; a worker that takes no bytes for this long reads no more.
SEND_TIMEOUT = 30.0
STDERR_TAIL_BYTES = 4096


class WorkerExited(Exception):
    """The worker's stream ended: the process is gone."""


class WorkerProcess:
    def __init__(
        self, backend: Backend, container_id: str, stream: ExecStream, max_frame: int
    ) -> None:
        self._backend = backend
        self._container_id = container_id
        self._stream = stream
        self._lines = LineBuffer(max_frame)
        self._pending: list[bytes] = []
        self._stderr_tail = b""
        self._ids = itertools.count(1)
        # Ids sent and not yet answered: besides the one a caller waits for, only those whose
        # caller was cancelled; their replies, when they come, are dropped.
        self._unanswered: set[str] = set()
        # Of those, the ones that asked for their output as it comes (``stream``).
        self._streaming: set[str] = set()
        self.pid = 0
        self.alive = True
        # When the worker last answered (monotonic): how long it has been idle since.
        self.answered_at = time.monotonic()

    @property
    def exec_id(self) -> str:
        return self._stream.exec_id

    @property
    def stderr_tail(self) -> str:
        return self._stderr_tail.decode("utf-8", "replace")

    @classmethod
    async def start(
        cls,
        backend: Backend,
        container_id: str,
        config: Mapping[str, Any],
        *,
        max_frame: int,
        argv: Sequence[str] = WORKER_ARGV,
        env: Mapping[str, str] | None = None,
    ) -> WorkerProcess:
        """Start a worker with ``config``; ``env`` (the session's) under its own settings,
        which no user variable can replace."""
        spec = ExecSpec(
            argv=[*PID_ANNOUNCER, *argv],
            env={**(env or {}), "SANDHOLD_WORKER_CONFIG": json.dumps(config)},
        )
        return await cls._open(backend, container_id, spec, max_frame=max_frame)

    @classmethod
    async def attach(
        cls,
        backend: Backend,
        container_id: str,
        pid: int,
        *,
        max_frame: int,
        ready_timeout: float = READY_TIMEOUT,
    ) -> WorkerProcess:
        """Reach a persistent worker that outlived the orchestrator which started it, through a
        relay exec (``worker/relay.py``). The relay announces the pid at the far end of the
        socket; it must be ``pid``, the worker the registry knows, or this is not our worker."""
        spec = ExecSpec(argv=[*RELAY_ARGV, str(pid)])
        # On failure only the relay goes: the caller decides what becomes of the worker.
        worker = await cls._open(
            backend,
            container_id,
            spec,
            max_frame=max_frame,
            kill=False,
            timeout=ready_timeout,
            unknown_pid_is=pid,
        )
        if worker.pid != pid:
            await worker._stream.aclose()  # a stranger on the socket: leave it, drop the relay
            raise ProtocolViolation(f"the worker's socket is held by pid {worker.pid}, not {pid}")
        return worker

    @classmethod
    async def _open(
        cls,
        backend: Backend,
        container_id: str,
        spec: ExecSpec,
        *,
        max_frame: int,
        kill: bool = True,
        timeout: float = READY_TIMEOUT,
        unknown_pid_is: int | None = None,
    ) -> WorkerProcess:
        stream = await backend.open_exec(container_id, spec)
        worker = cls(backend, container_id, stream, max_frame)
        try:
            with anyio.fail_after(timeout):
                worker.pid = await worker._announced_pid()
                if worker.pid == 0 and unknown_pid_is is not None:
                    # The relay's kernel cannot name its peer (gVisor answers SO_PEERCRED with
                    # the relay's own pid): the pid the worker bound its socket under stands.
                    worker.pid = unknown_pid_is
                frame = await worker._next_frame()
            if isinstance(frame, FatalFrame):
                raise ProtocolViolation(f"worker refused to start: {frame.error_message}")
            if not isinstance(frame, ReadyFrame) or frame.protocol != PROTOCOL_VERSION:
                raise ProtocolViolation(f"expected a ready frame, got {frame!r:.200}")
            if frame.pid != worker.pid:
                raise ProtocolViolation(f"worker says it is pid {frame.pid}, it is {worker.pid}")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await (worker.kill() if kill else worker.detach())
            raise
        return worker

    async def send(self, op: str, **args: Any) -> str:
        """Send a request; returns its id for ``receive_reply``. Shielded: a cancel that lands
        once the line is handed over would end the call with its request running; it takes
        effect at the caller's wait for the reply instead, where the caller deals with it."""
        request_id = f"r{next(self._ids)}"
        line = encode_request(request_id, op, **args)
        # Before the write: asyncio's own cancel gets through a shield, and the line may be out
        # by then; if so, its reply is one to drop.
        self._unanswered.add(request_id)
        if args.get("stream"):
            self._streaming.add(request_id)
        with anyio.CancelScope(shield=True), anyio.move_on_after(SEND_TIMEOUT) as bound:
            try:
                await self._stream.send(line)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                self.alive = False
                raise WorkerExited("the worker's stdin is closed") from exc
        if bound.cancelled_caught:
            self.alive = False
            raise WorkerExited(f"the worker took no request for {SEND_TIMEOUT:g} s")
        return request_id

    async def receive_reply(
        self, request_id: str, on_output: OutputListener | None = None
    ) -> Reply:
        """The reply to ``request_id``; its streamed output, if it streams, to ``on_output`` on
        the way. Replies and output of earlier requests whose callers gave up are dropped; any
        other frame is a protocol violation."""
        while True:
            frame = await self._next_frame()
            if isinstance(frame, StreamFrame):
                if frame.id not in self._streaming:
                    raise ProtocolViolation(f"output for {frame.id!r}, which does not stream")
                if frame.id == request_id and on_output is not None:
                    on_output(frame.name, frame.text)
                continue  # a caller that gave up, or one that reads only the reply
            if not isinstance(frame, Reply):
                raise ProtocolViolation(f"expected a reply, got a {type(frame).__name__}")
            if frame.id == request_id:
                self._unanswered.discard(request_id)
                self._streaming.discard(request_id)
                self.answered_at = time.monotonic()
                return frame
            if frame.id is None or frame.id not in self._unanswered:
                raise ProtocolViolation(f"reply for {frame.id!r} while waiting for {request_id!r}")
            self._unanswered.discard(frame.id)
            self._streaming.discard(frame.id)

    async def request(self, op: str, **args: Any) -> Reply:
        return await self.receive_reply(await self.send(op, **args))

    async def _announced_pid(self) -> int:
        while not self._pending:
            await self._read_chunk()
        match = _PID_LINE.match(self._pending.pop(0))
        if match is None:
            raise ProtocolViolation("the worker's launcher did not announce its pid")
        return int(match.group(1))

    async def _read_chunk(self) -> None:
        chunk = await self._stream.receive()
        if chunk is None:
            self.alive = False
            raise WorkerExited("the worker's output ended")
        stream, data = chunk
        if stream == STDOUT:
            self._pending.extend(self._lines.feed(data))
        else:
            self._stderr_tail = (self._stderr_tail + data)[-STDERR_TAIL_BYTES:]

    async def _next_frame(self) -> ReadyFrame | FatalFrame | StreamFrame | Reply:
        while not self._pending:
            await self._read_chunk()
        return decode_frame(self._pending.pop(0))

    async def signal(self, name: str) -> None:
        """Deliver a signal (``INT``, ``KILL``) to the worker inside its container."""
        if self.pid:
            await kill_pid(self._backend, self._container_id, self.pid, name)

    async def kill(self) -> None:
        """SIGKILL the worker and release its stream; safe to call more than once."""
        with anyio.CancelScope(shield=True):
            try:
                if self.alive and self.pid:
                    await self.signal("KILL")
            except BackendError:
                pass  # the container is gone, and the worker with it
            finally:
                self.alive = False
                await self._stream.aclose()

    async def detach(self) -> None:
        """Close the stream and leave the worker running (a persistent one waits for a relay)."""
        self.alive = False
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()

    async def exit_code(self) -> int | None:
        return await self._backend.wait_exec_exit(self.exec_id, timeout=5.0)


async def kill_pid(backend: Backend, container_id: str, pid: int, name: str = "KILL") -> None:
    """Send signal ``name`` to ``pid`` inside the container (argv only, no shell string)."""
    argv = ["/bin/sh", "-c", 'kill -s "$1" "$2"', "sh", name, str(pid)]
    await backend.run(
        container_id, ExecSpec(argv=argv), timeout=SIGNAL_TIMEOUT, max_output_bytes=4096
    )
