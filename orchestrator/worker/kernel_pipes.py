"""A language process's output during one cell, for the kernels (kernel_bash.py,
kernel_node.py): after the cell the process prints a marker (a random token the cell never
sees, then a trailer line) on stdout and the token on stderr; everything before the markers is
the cell's output, kept within the stream cap and streamed as it comes; ``with_output`` puts
it, and the cell's time, into the reply."""

import contextlib
import os
import selectors
import subprocess
import time
from typing import Any

from .kernel import Sink

_READ_BYTES = 1 << 16
# A language process that closed its pipes is ending: its exit is waited for this long, so that
# the kernel, which ends with it right after its reply, is gone before the host's next request
# (else that request could find it still up, then lose it mid-cell).
ENDED_WAIT_S = 5.0


def collect(
    fds: "tuple[int, int]", token: bytes, limit: int, sink: "Sink | None"
) -> "tuple[list[tuple[bytes, int]], bytes | None]":
    """(kept bytes, total bytes) of stdout and stderr up to their markers, and stdout's trailer;
    None for the trailer when the process ended before its marker."""
    pipes = [_Pipe(fd, token, limit, sink, index) for index, fd in enumerate(fds)]
    with selectors.DefaultSelector() as selector:
        for pipe in pipes:
            selector.register(pipe.fd, selectors.EVENT_READ, pipe)
        while not all(pipe.done for pipe in pipes):
            for key, _ in selector.select():
                pipe = key.data
                pipe.feed(os.read(pipe.fd, _READ_BYTES))
                if pipe.done:
                    selector.unregister(pipe.fd)
    return [(p.kept, p.total) for p in pipes], pipes[0].trailer


class _Pipe:
    """One of a language process's output pipes during a cell: what comes before the marker,
    kept up to the stream cap and streamed as it comes; a tail that may be the start of the
    marker is held back until the next read tells. The marker's line after the token is the
    trailer (bash's status, node's outcome)."""

    def __init__(self, fd: int, token: bytes, limit: int, sink: Sink | None, index: int) -> None:
        self.fd = fd
        self._token = token
        self._limit = limit
        self._sink = sink
        self._index = index
        self._pending = b""
        self.kept = b""
        self.total = 0
        self.done = False
        self.trailer: bytes | None = None

    def feed(self, data: bytes) -> None:
        if not data:  # the process is gone
            self._emit(self._pending)
            self.done = True
            return
        self._pending += data
        at = self._pending.find(self._token)
        if at < 0:
            hold = _partial_marker(self._pending, self._token)
            self._emit(self._pending[: len(self._pending) - hold])
            self._pending = self._pending[len(self._pending) - hold :]
            return
        end = self._pending.find(b"\n", at)
        if end < 0:
            return  # the rest of the marker line comes with the next read
        self._emit(self._pending[:at])
        self.trailer = self._pending[at + len(self._token) : end]
        self.done = True

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        self.total += len(data)
        room = self._limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]
            if self._sink is not None:
                self._sink(self._index, data[:room])


def _partial_marker(data: bytes, token: bytes) -> int:
    """How many bytes at the end of ``data`` may be the start of ``token`` (held back until the
    next read says whether they are)."""
    for length in range(min(len(token) - 1, len(data)), 0, -1):
        if token.startswith(data[-length:]):
            return length
    return 0


def with_output(
    reply: "dict[str, Any]",
    streams: "list[tuple[bytes, int]]",
    started: float,
    cpu_spent: float,
) -> "dict[str, Any]":
    """``reply`` with the cell's streams (what was kept, its size, whether it was cut), its wall
    time since ``started`` (``time.perf_counter``) and ``cpu_spent`` seconds of CPU."""
    for index, name in enumerate(("stdout", "stderr")):
        data, total = streams[index]
        reply[name] = data.decode("utf-8", "replace")
        reply[f"{name}_bytes"] = total
        reply["truncated"] = reply["truncated"] or total > len(data)
    reply["execution_time_ms"] = round((time.perf_counter() - started) * 1000, 3)
    reply["cpu_time_ms"] = round(max(cpu_spent, 0.0) * 1000, 3)
    return reply


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and the children it waited for (its /proc stat); 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def wait_ended(process: "subprocess.Popen[bytes]") -> None:
    """Wait, bounded, for a language process whose pipes closed to have exited."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=ENDED_WAIT_S)
