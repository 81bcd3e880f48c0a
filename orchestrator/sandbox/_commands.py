"""Commands in a sandbox: ``commands.run`` (the session's persistent shell, or a terminal when
it needs a working directory or runs in the background), and thin wrappers over the
``terminal`` and ``process`` tools.

A foreground command without ``cwd`` runs in the persistent shell (``terminal`` ``run``): one
call, and ``cd``/``export`` last for the next command. With ``cwd``, or in the background, it
runs in a terminal of its own on pipes (``start``); a ``CommandHandle`` follows its output with
the terminal's byte cursor, and waits in slices the tool allows (``MAX_WAIT_MS``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Final

import anyio

from orchestrator.sandbox._calls import AsyncPart, SessionCalls
from orchestrator.sandbox._results import CommandResult, payload

__all__ = ["AsyncCommands", "AsyncProcesses", "AsyncTerminals", "CommandHandle", "ProcessHandle"]

# The terminal tool's longest single wait; a longer wait is several.
MAX_WAIT_MS: Final = 60_000
# A command started in the background answers at once; its output is read by wait().
BACKGROUND_YIELD_MS: Final = 0
TERMINAL = "terminal"
PROCESS = "process"
# ProcessHandle.wait asks for the state this often at first, doubling up to the second figure:
# a short job is seen ending at once, a long one costs a call a second.
PROCESS_POLL_S: Final = 0.1
MAX_PROCESS_POLL_S: Final = 1.0


class CommandHandle(AsyncPart):
    """A command running in a terminal of its own: ``wait()`` for its end, ``kill()``,
    ``send_stdin()``. ``output`` is what has been read of it so far."""

    def __init__(self, calls: SessionCalls, started: dict[str, Any]) -> None:
        self._calls = calls
        self.terminal_id: str = started["terminal_id"]
        self.output: str = started.get("output", "")
        self._offset: int = started.get("next_offset", 0)
        self.exit_code: int | None = started.get("exit_code")
        self._exited = started.get("state") == "exited"

    async def wait(self, timeout: float | None = None) -> CommandResult:
        """Its result once it ends; after ``timeout`` seconds (None: no limit) one with
        ``timed_out`` and the output so far, the command left running."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while not self._exited:
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0:
                return CommandResult(self.output, None, timed_out=True)
            await self._read(int(min(left_ms, MAX_WAIT_MS)))
        return CommandResult(self.output, self.exit_code)

    async def _read(self, timeout_ms: int) -> None:
        read = await self._calls(
            TERMINAL, "wait", session=False, terminal_id=self.terminal_id,
            since_offset=self._offset, timeout_ms=max(timeout_ms, 0),
        )  # fmt: skip
        self.output += read.get("output", "")
        self._offset = read.get("next_offset", self._offset)
        self.exit_code = read.get("exit_code")
        self._exited = read.get("state") == "exited" and not read.get("has_more", False)

    async def kill(self, signal: str = "TERM") -> None:
        """``signal`` to the command's process group, KILL after a grace."""
        await self._calls(
            TERMINAL, "kill", session=False, terminal_id=self.terminal_id, signal=signal
        )

    async def send_stdin(self, text: str, *, close: bool = False) -> None:
        """``text`` to the command's input; ``close`` ends the input afterwards."""
        await self._calls(
            TERMINAL, "write", session=False, terminal_id=self.terminal_id,
            input_text=text, close_stdin=close,
        )  # fmt: skip


class AsyncCommands(AsyncPart):
    def __init__(self, calls: SessionCalls, default_timeout: float | None) -> None:
        self._calls = calls
        self._default_timeout = default_timeout

    async def run(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        background: bool = False,
        confirm_dangerous: bool = False,
    ) -> Any:
        """A ``CommandResult`` once ``cmd`` ends (``timed_out`` if it ran out of ``timeout``
        seconds), or with ``background`` a ``CommandHandle`` at once."""
        timeout = timeout if timeout is not None else self._default_timeout
        if cwd is None and not background:
            ran = await self._calls(
                TERMINAL, "run", command=cmd, env=env, timeout_s=timeout,
                confirm_dangerous=confirm_dangerous or None,
            )  # fmt: skip
            return CommandResult(
                ran.get("stdout", ""), ran.get("exit_code"),
                timed_out=bool(ran.get("timed_out")), truncated=bool(ran.get("truncated")),
                cwd=ran.get("cwd"),
            )  # fmt: skip
        started = await self._calls(
            TERMINAL, "start", command=cmd, cwd=cwd, env=env, use_pty=False,
            yield_time_ms=BACKGROUND_YIELD_MS, confirm_dangerous=confirm_dangerous or None,
        )  # fmt: skip
        handle = CommandHandle(self._calls, started)
        if background:
            return handle
        result = await handle.wait(timeout)
        if result.timed_out:
            await handle.kill("KILL")
        return result


class AsyncTerminals(AsyncPart):
    """The ``terminal`` tool on this sandbox; each method answers the tool's fields."""

    def __init__(self, calls: SessionCalls) -> None:
        self._calls = calls

    async def start(self, command: str, **options: Any) -> dict[str, Any]:
        return payload(await self._calls(TERMINAL, "start", command=command, **options))

    async def _on(self, operation: str, terminal_id: str, **options: Any) -> dict[str, Any]:
        answer = await self._calls(
            TERMINAL, operation, session=False, terminal_id=terminal_id, **options
        )
        return payload(answer)

    async def read(self, terminal_id: str, **cursors: Any) -> dict[str, Any]:
        return await self._on("read", terminal_id, **cursors)

    async def wait(self, terminal_id: str, **options: Any) -> dict[str, Any]:
        return await self._on("wait", terminal_id, **options)

    async def write(self, terminal_id: str, text: str, *, close: bool = False) -> dict[str, Any]:
        return await self._on("write", terminal_id, input_text=text, close_stdin=close)

    async def interrupt(self, terminal_id: str) -> dict[str, Any]:
        return await self._on("interrupt", terminal_id)

    async def kill(self, terminal_id: str, signal: str = "TERM") -> dict[str, Any]:
        return await self._on("kill", terminal_id, signal=signal)

    async def resize(self, terminal_id: str, rows: int, cols: int) -> dict[str, Any]:
        return await self._on("resize", terminal_id, rows=rows, cols=cols)


class ProcessHandle(AsyncPart):
    """A background process (``processes.start``), as ``commands.run(background=True)`` answers
    a ``CommandHandle``: ``wait()`` for its end, ``kill()``, ``logs()``; ``state``,
    ``exit_code`` and ``ports`` (the TCP ports it listens on) as last seen by any of them or by
    ``refresh()``."""

    def __init__(self, calls: SessionCalls, started: dict[str, Any]) -> None:
        self._calls = calls
        self.process_id: str = started["process_id"]
        self.pid: int = started["pid"]
        self.command: str = started.get("command", "")
        self.cwd: str | None = started.get("cwd")
        self.state: str = "running"
        self.exit_code: int | None = None
        self.ports: list[int] = []

    def _seen(self, info: dict[str, Any]) -> None:
        self.state = info.get("state", self.state)
        self.exit_code = info.get("exit_code", self.exit_code)
        self.ports = list(info.get("ports", self.ports))

    async def refresh(self) -> str:
        """Ask how it is (one ``list``); its state: ``running``, ``exited`` or ``killed``."""
        listed = await self._calls(PROCESS, "list")
        for info in listed.get("processes", []):
            if info.get("process_id") == self.process_id:
                self._seen(info)
        return self.state

    async def logs(self, *, tail: int = 100) -> str:
        """The last ``tail`` lines of its output (stdout and stderr, as written)."""
        answer = await self._calls(
            PROCESS, "read_output", session=False, process_id=self.process_id, tail=tail
        )
        self._seen(answer)
        return str(answer.get("output", ""))

    async def wait(self, timeout: float | None = None, *, tail: int = 100) -> CommandResult:
        """Its result once it ends: the exit code and the last ``tail`` lines of output; after
        ``timeout`` seconds (None: no limit) one with ``timed_out``, the process left running.
        The process tool has no wait: its state is asked every ``PROCESS_POLL_S`` or so."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        pause = PROCESS_POLL_S
        while await self.refresh() == "running":
            left = deadline - time.monotonic()
            if left <= 0:
                return CommandResult(await self.logs(tail=tail), None, timed_out=True)
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, MAX_PROCESS_POLL_S)
        return CommandResult(await self.logs(tail=tail), self.exit_code)

    async def kill(self) -> bool:
        """TERM to its process group, KILL after a grace; whether no process of it is left."""
        answer = await self._calls(PROCESS, "kill", session=False, process_id=self.process_id)
        self._seen(answer)
        return bool(answer.get("group_empty"))


class AsyncProcesses(AsyncPart):
    """The ``process`` tool on this sandbox: ``start`` answers a ``ProcessHandle``; ``list``,
    ``logs`` and ``kill`` (by id) answer the tool's fields."""

    def __init__(self, calls: SessionCalls) -> None:
        self._calls = calls

    async def start(self, command: str, **options: Any) -> ProcessHandle:
        """Start ``command`` in the background (the tool's options: ``cwd``, ``env``, ...)."""
        started = await self._calls(PROCESS, "start", command=command, **options)
        return ProcessHandle(self._calls, started)

    async def list(self) -> list[dict[str, Any]]:
        listed = await self._calls(PROCESS, "list")
        return list(listed.get("processes", []))

    async def logs(self, process_id: str, *, tail: int = 100) -> dict[str, Any]:
        answer = await self._calls(
            "process", "read_output", session=False, process_id=process_id, tail=tail
        )
        return payload(answer)

    async def kill(self, process_id: str) -> dict[str, Any]:
        answer = await self._calls("process", "kill", session=False, process_id=process_id)
        return payload(answer)
