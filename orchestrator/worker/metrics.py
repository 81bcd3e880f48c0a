"""Per-request resource accounting: wall time, CPU time of the worker and its waited-for
children, and peak resident memory during the request. The peak comes from VmHWM after resetting
it through /proc/self/clear_refs; where /proc does not allow that, the lifetime peak
(ru_maxrss) is the best answer there is."""

import os
import resource
import time

_KIB_PER_MIB = 1024


class Usage:
    """One request's figures (a plain class: see config.WorkerConfig for why not a dataclass)."""

    __slots__ = ("cpu_time_ms", "execution_time_ms", "peak_memory_mb")

    def __init__(self, execution_time_ms: float, cpu_time_ms: float, peak_memory_mb: float) -> None:
        self.execution_time_ms = execution_time_ms
        self.cpu_time_ms = cpu_time_ms
        self.peak_memory_mb = peak_memory_mb


class ResourceMeter:
    """Measures one request at a time; /proc files are opened once and kept."""

    def __init__(self) -> None:
        self._clear_refs = _open("/proc/self/clear_refs", os.O_WRONLY)
        self._status = _open("/proc/self/status", os.O_RDONLY)
        self._wall = 0.0
        self._cpu = 0.0

    def start(self) -> None:
        if self._clear_refs is not None:
            try:
                os.write(self._clear_refs, b"5")  # reset VmHWM to the current RSS
            except OSError:
                self._clear_refs = None
        self._cpu = _cpu_seconds()
        self._wall = time.perf_counter()

    def stop(self) -> Usage:
        wall = time.perf_counter() - self._wall
        cpu = _cpu_seconds() - self._cpu
        return Usage(round(wall * 1000, 3), round(max(cpu, 0.0) * 1000, 3), self._peak_mb())

    def _peak_mb(self) -> float:
        if self._clear_refs is not None and self._status is not None:
            try:
                status = os.pread(self._status, 1 << 14, 0)
                start = status.index(b"VmHWM:") + 6
                kib = int(status[start : status.index(b"kB", start)])
                return round(kib / _KIB_PER_MIB, 3)
            except (OSError, ValueError, IndexError):
                pass
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / _KIB_PER_MIB, 3)


def _open(path: str, flags: int) -> int | None:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError:
        return None


def _cpu_seconds() -> float:
    # process_time has nanosecond resolution where os.times() counts 10 ms clock ticks.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
