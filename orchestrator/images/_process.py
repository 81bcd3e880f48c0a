"""Running a host tool (debootstrap, tar, pip) with its output streamed line by line into the
build progress. Each tool runs in its own process group so a timeout or a cancellation stops the
whole tree it spawned (debootstrap forks wget, dpkg and chroot), TERM first, KILL after a grace."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import ByteReceiveStream, Process

from orchestrator.errors import ImageError
from orchestrator.images.progress import BuildProgress

# Enough lines to see why a tool failed without flooding an error message.
TAIL_LINES = 15
# A tool's log line longer than this is noise (a progress bar, a dump); keep its start.
MAX_LINE_CHARS = 400
# debootstrap and pip exit within a second of TERM; past this the group is killed.
KILL_GRACE = 5.0


@dataclass(frozen=True)
class ToolOutcome:
    """How a tool ended and the last lines it printed (stdout and stderr merged)."""

    returncode: int
    tail: tuple[str, ...]

    def describe(self) -> str:
        return " | ".join(self.tail) if self.tail else "(no output)"


async def run_tool(
    argv: Sequence[str],
    *,
    progress: BuildProgress,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> ToolOutcome:
    """Run ``argv`` to completion within ``timeout`` seconds; never raises on a non-zero exit."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    process = await anyio.open_process(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    async with process:
        try:
            with anyio.fail_after(timeout):
                assert process.stdout is not None
                await _pump(process.stdout, tail, progress)
                returncode = await process.wait()
        except TimeoutError:
            await _stop(process)
            raise ImageError(
                f"{os.path.basename(argv[0])} did not finish within {timeout:.0f} s",
                hint=" | ".join(tail) or None,
            ) from None
        except BaseException:
            await _stop(process)
            raise
    return ToolOutcome(returncode, tuple(tail))


async def _pump(stream: ByteReceiveStream, tail: deque[str], progress: BuildProgress) -> None:
    pending = b""
    async for chunk in stream:
        pending += chunk
        *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
        if len(pending) > 64 * 1024:
            lines.append(pending)
            pending = b""
        for raw in lines:
            _emit(raw, tail, progress)
    _emit(pending, tail, progress)


def _emit(raw: bytes, tail: deque[str], progress: BuildProgress) -> None:
    line = raw.decode("utf-8", errors="replace").rstrip()[:MAX_LINE_CHARS]
    if line.strip():
        tail.append(line)
        progress.log(line)


async def _stop(process: Process) -> None:
    with anyio.CancelScope(shield=True):
        _signal_group(process, signal.SIGTERM)
        with anyio.move_on_after(KILL_GRACE):
            await process.wait()
        # Also reaches children that outlived a leader which obeyed TERM.
        _signal_group(process, signal.SIGKILL)
        await process.wait()


def _signal_group(process: Process, signum: int) -> None:
    # The tool leads its own session (start_new_session), so its group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
