"""Per-request capture of fd 1 and fd 2, so ``print``, C code and child processes all land in the
request's output.

One pipe per stream lives as long as the worker. While a request runs, the pipes' write ends are
dup2'ed onto fd 1 and fd 2; at its end fd 1/2 go back to /dev/null. A long-lived thread drains
both pipes through epoll into the current request's buffers, keeping at most ``limit`` bytes per
stream and counting the rest, so a flood costs bounded memory and never blocks its writer.

When fd 1/2 are restored, every byte this process or a finished child wrote is already in a
pipe (pipe writes are synchronous), so ``finish`` reads what is there and returns at once: it
never waits for EOF, and a background child that inherited fd 1/2 cannot make it hang. What
such a child writes later is discarded while the worker is idle and lands in the request that is
running when it writes.

Invariants: every read of a pipe happens under ``_lock`` with the fd non-blocking, so a read
never waits and bytes are credited to the request that was current when they were read. The
drain thread blocks every signal, so SIGINT always interrupts the main thread.
"""

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

_CHUNK = 1 << 16
# Reads per wake-up of the drain thread before it lets the lock go, so finish() never starves.
_READS_PER_WAKE = 16
# finish() reads at most this much: far more than the pipe holds of ours (the drain thread keeps
# up), and a bound when a background child floods the pipe faster than it can be read.
_FINISH_READ_LIMIT = 64
# While a request streams, the drain thread lets output gather this long after a wake-up, so a
# loop of small prints goes out as a few frames, not one per print.
_STREAM_GATHER_S = 0.02
# Where streamed output goes: (0 for stdout, 1 for stderr, the bytes). Called with the lock held,
# from the drain thread or from finish(); it must not raise.
Sink = Callable[[int, bytes], None]


class _Buffer:
    __slots__ = ("chunks", "dropped", "kept", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0

    def feed(self, data: bytes) -> bytes:
        """Keep what fits; returns the part kept."""
        room = self.limit - self.kept
        if room >= len(data):
            self.chunks.append(data)
            self.kept += len(data)
            return data
        kept = data[: max(room, 0)]
        if kept:
            self.chunks.append(kept)
            self.kept += len(kept)
        self.dropped += len(data) - len(kept)
        return kept


class CapturedOutput:
    """One request's output (a plain class: see config.WorkerConfig for why not a dataclass)."""

    __slots__ = ("stderr", "stderr_bytes", "stdout", "stdout_bytes", "truncated")

    def __init__(
        self,
        stdout: bytes,
        stderr: bytes,
        truncated: bool,
        stdout_bytes: int = 0,
        stderr_bytes: int = 0,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.truncated = truncated
        # Everything written, kept or not: the caller learns how much a cap cut away.
        self.stdout_bytes = stdout_bytes
        self.stderr_bytes = stderr_bytes


class OutputCapture:
    """fd-level capture of fd 1 and 2, one request at a time."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        self._pipes: list[tuple[int, int]] = [os.pipe(), os.pipe()]  # (read, write), private
        self._buffers: dict[int, _Buffer] | None = None  # read fd -> buffer; None while idle
        self._stream_of = {read_end: index for index, (read_end, _) in enumerate(self._pipes)}
        self._sink: Sink | None = None  # the running request's, when it streams
        self._epoll = select.epoll()
        self._ready = select.poll()  # for a zero-timeout look that costs no exception
        for read_end, _write_end in self._pipes:
            os.set_blocking(read_end, False)
            self._epoll.register(read_end, select.EPOLLIN)
            self._ready.register(read_end, select.POLLIN)
        threading.Thread(target=self._drain_forever, name="sandhold-output", daemon=True).start()

    def start(self, sink: Sink | None = None) -> None:
        """Point fd 1 and 2 at the pipes; output from now on belongs to this request, and with
        ``sink``, what is kept of it also goes there as it comes (so a stream never carries
        more than the reply would)."""
        with self._lock:
            for read_end in self._readable():
                self._read(read_end, None, _FINISH_READ_LIMIT)  # late output of a past request
            self._buffers = {read_end: _Buffer(self._limit) for read_end, _ in self._pipes}
            self._sink = sink
        for target, (_read_end, write_end) in zip((1, 2), self._pipes, strict=True):
            os.dup2(write_end, target)

    def finish(self) -> CapturedOutput:
        """Restore fd 1 and 2 to /dev/null and collect what the request wrote."""
        _flush_std()
        os.dup2(self._null, 1)
        os.dup2(self._null, 2)
        with self._lock:
            buffers = self._buffers
            assert buffers is not None, "finish() without start()"
            for read_end in self._readable():
                self._read(read_end, buffers[read_end], _FINISH_READ_LIMIT)
            self._buffers, self._sink = None, None
        out, err = (buffers[read_end] for read_end, _ in self._pipes)
        truncated = bool(out.dropped or err.dropped)
        return CapturedOutput(
            b"".join(out.chunks),
            b"".join(err.chunks),
            truncated,
            out.kept + out.dropped,
            err.kept + err.dropped,
        )

    def _read(self, fd: int, buffer: _Buffer | None, max_reads: int) -> None:
        """Move what the pipe holds now into ``buffer`` (None: discard). Caller holds the lock.
        A short read means the pipe was empty: whatever was written before is in hand."""
        for _ in range(max_reads):
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            if buffer is not None:
                kept = buffer.feed(data)
                if kept and self._sink is not None:
                    self._sink(self._stream_of[fd], kept)
            if len(data) < _CHUNK:
                return

    def _readable(self) -> set[int]:
        return {fd for fd, _events in self._ready.poll(0)}

    def _drain_forever(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            ready = self._epoll.poll()
            if self._sink is not None:
                time.sleep(_STREAM_GATHER_S)
            for fd, _events in ready:
                with self._lock:
                    buffer = None if self._buffers is None else self._buffers.get(fd)
                    self._read(fd, buffer, _READS_PER_WAKE)


def _flush_std() -> None:
    """Push what Python buffered for fd 1/2 into the pipes before they are taken away."""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (contextlib.suppress would cost a context manager per cell)
            stream.flush()
        except Exception:  # user code may have replaced or closed them
            pass
