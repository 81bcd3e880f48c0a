"""Background processes of one session: the host half of the ``process`` tool.

Each operation is one short exec of ``/opt/sandhold/worker/procs.py`` in the session's container,
which keeps the registry, the capped logs and the process groups (its docstring draws the layout).

Invariants: arguments are checked here before anything reaches the engine, so a bad one starts
nothing; every reply is untrusted input, bounded in size, decoded strictly and checked against the
models below, and anything else is a ``BackendError`` (the exchange is ``helper_exchange``'s);
the running-process quota is counted and enforced inside the container under the registry's
lock, so concurrent starts cannot both slip under it; process ids are 128 random bits, and every
unknown id gets the same answer.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backend.base import WORKSPACE, Backend
from orchestrator.errors import (
    BackendError,
    InvalidArgumentError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.policy.arguments import check_int
from orchestrator.policy.commands import MAX_COMMAND_BYTES, enforce
from orchestrator.policy.env import check_env, merged_env
from orchestrator.policy.model import Policy
from orchestrator.session.helper_exchange import (
    Helper,
    HelperFailure,
    call_helper,
    parse_reply,
)
from orchestrator.session.paths import workspace_path
from orchestrator.session.repl.protocol import MAX_COUNT

PROCS_ARGV = ("python3", "-I", "/opt/sandhold/worker/procs.py")
# 128 bits of randomness: a process id is as unguessable as a session id.
PROCESS_ID_BYTES = 16
_PROCESS_ID = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_TAIL = 100
MAX_TAIL_LINES = 10_000
# The log holds twice what one read returns: a rotation keeps half, so a full read survives it.
LOG_CAP_PER_STREAM_BYTES = 2
# An op is a Python start (~100 ms) plus a fork or a walk of /proc; 30 s means a frozen container.
OP_TIMEOUT = 30.0
# What procs.py may wait past the grace: SIGKILL taking effect, then the exit being recorded.
KILL_EXTRA_WAIT = 5.0 + 2.0
# A list holds at most 256 running and 32 finished entries, each under ~7 KiB even fully escaped.
MAX_LIST_REPLY_BYTES = 4 * 1024 * 1024
# Output is JSON-escaped (a control byte becomes six characters) and framed by the fixed fields.
ESCAPE_FACTOR = 6
REPLY_SLACK_BYTES = 64 * 1024

ProcessState = Literal["running", "exited", "killed"]
ProcessId = Annotated[str, Field(pattern=_PROCESS_ID.pattern)]
Pid = Annotated[int, Field(ge=1, lt=2**22)]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Result(BaseModel):
    # Strict: these are filled from untrusted container replies, where "7" is not 7.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ProcessStartResult(_Result):
    """A background process just launched; ``pid`` leads its own process group ``pgid``."""

    process_id: ProcessId
    pid: Pid
    pgid: Pid
    command: str
    cwd: str = Field(max_length=4096)


class ProcessInfo(_Result):
    """One background process as ``list`` shows it. ``exit_code`` is the starting shell's status
    (minus the signal number when a signal ended it), known once the group has ended."""

    process_id: ProcessId
    state: ProcessState
    exit_code: int | None = Field(ge=-64, le=255)
    ports: tuple[Port, ...] = Field(max_length=1024, strict=False)
    elapsed_s: float = Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False)
    pid: Pid
    command: str = Field(max_length=MAX_COMMAND_BYTES)


class ProcessListResult(_Result):
    processes: tuple[ProcessInfo, ...] = Field(max_length=1024, strict=False)
    # TCP ports anything in the container listens on (the REPL's own servers included).
    listening: tuple[Port, ...] = Field(default=(), max_length=256, strict=False)


class ProcessOutputResult(ProcessInfo):
    """The last lines of a process's log. ``dropped_bytes`` counts output the log cap discarded;
    ``truncated`` says fewer lines than asked for came back because of a cap, not because the
    process printed fewer."""

    output: str
    lines: int = Field(ge=0, le=MAX_TAIL_LINES)
    dropped_bytes: int = Field(ge=0, le=MAX_COUNT)
    truncated: bool


class ProcessKillResult(ProcessInfo):
    """What a kill took: ``signal_used`` is the strongest signal sent (None if the group had
    already ended); ``group_empty`` says no process of the group remains."""

    signal_used: Literal["SIGTERM", "SIGKILL"] | None
    group_empty: bool


def _quota_refusal(failure: HelperFailure) -> QuotaExceededError:
    return QuotaExceededError(
        f"processes_per_session: {failure.running} background processes are running",
        quota="processes_per_session",
        hint="kill one first",
    )


PROCESS_HELPER = Helper(
    "process helper",
    refusals={
        "session_not_found": lambda failure: SessionNotFoundError(_unknown_message()),
        "invalid_argument": lambda failure: InvalidArgumentError(failure.error_message),
        "quota_exceeded": _quota_refusal,
    },
)


class SessionProcesses:
    """The background processes of one session container."""

    def __init__(self, backend: Backend, container_id: str, policy: Policy) -> None:
        self._backend = backend
        self._container_id = container_id
        self._policy = policy
        # The owning tenant's own processes_per_session quota, when lower than the policy's.
        self.tenant_cap: int | None = None
        # Told each new process id, so the manager finds the session by it on every path.
        self.on_started: Callable[[str], None] | None = None
        # The session's env (checked when the session was made): every process gets it.
        self.session_env: Mapping[str, str] = {}

    def _max_running(self) -> int:
        limit = self._policy.limits.processes_per_session
        if self.tenant_cap is not None:
            limit = min(limit, self.tenant_cap)
        if limit < 1:  # the helper counts from one: a cap of none is refused here
            raise QuotaExceededError(
                "processes_per_session: this tenant may run no background process",
                quota="processes_per_session",
            )
        return limit

    async def start(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        confirm_dangerous: bool = False,
    ) -> ProcessStartResult:
        """Launch ``bash -c command`` in the background if the shell policy allows it, with the
        session's env and ``env`` over it (in the request: the helper's own exec gets none of
        it); ``quota_exceeded`` past the policy's ``limits.processes_per_session`` running ones."""
        command = enforce(command, self._policy, confirm_dangerous=confirm_dangerous)
        request = {
            "process_id": secrets.token_hex(PROCESS_ID_BYTES),
            "command": command,
            "cwd": WORKSPACE if cwd is None else workspace_path(cwd, name="cwd"),
            "env": merged_env(self.session_env, check_env(env, self._policy)),
            "max_log_bytes": LOG_CAP_PER_STREAM_BYTES * self._policy.output.max_stream_bytes,
            "max_running": self._max_running(),
        }
        data = await self._call("start", request, max_reply_bytes=REPLY_SLACK_BYTES)
        result = parse_reply(
            PROCESS_HELPER, "start", ProcessStartResult, {**data, "command": command}
        )
        if result.process_id != request["process_id"] or result.pgid != result.pid:
            raise BackendError("the process helper answered start for another process")
        if self.on_started is not None:
            self.on_started(result.process_id)
        return result

    async def list(self) -> ProcessListResult:
        data = await self._call("list", {}, max_reply_bytes=MAX_LIST_REPLY_BYTES)
        return parse_reply(PROCESS_HELPER, "list", ProcessListResult, data)

    async def read_output(
        self, process_id: str, *, tail: int = DEFAULT_TAIL
    ) -> ProcessOutputResult:
        """The last ``tail`` lines of the process's output (stdout and stderr, interleaved)."""
        process_id = _check_process_id(process_id)
        check_int(tail, "tail", 1, MAX_TAIL_LINES)
        max_bytes = self._policy.output.max_stream_bytes
        request = {"process_id": process_id, "tail": tail, "max_bytes": max_bytes}
        reply_cap = ESCAPE_FACTOR * max_bytes + REPLY_SLACK_BYTES
        data = await self._call("read_output", request, max_reply_bytes=reply_cap)
        result = parse_reply(PROCESS_HELPER, "read_output", ProcessOutputResult, data)
        if result.process_id != process_id or len(result.output) > max_bytes:
            raise BackendError("the process helper sent output it was not asked for")
        return result

    async def kill(self, process_id: str) -> ProcessKillResult:
        """TERM to the whole group, KILL after the policy's grace, then wait until it is empty."""
        process_id = _check_process_id(process_id)
        grace = self._policy.timeouts.kill_grace_s
        data = await self._call(
            "kill",
            {"process_id": process_id, "grace_s": grace},
            max_reply_bytes=REPLY_SLACK_BYTES,
            timeout=OP_TIMEOUT + grace + KILL_EXTRA_WAIT,
        )
        result = parse_reply(PROCESS_HELPER, "kill", ProcessKillResult, data)
        if result.process_id != process_id:
            raise BackendError("the process helper answered kill for another process")
        return result

    async def _call(
        self,
        op: str,
        request: dict[str, Any],
        *,
        max_reply_bytes: int,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        return await call_helper(
            self._backend,
            self._container_id,
            PROCESS_HELPER,
            [*PROCS_ARGV, op],
            request,
            max_reply_bytes=max_reply_bytes,
            timeout=OP_TIMEOUT if timeout is None else timeout,
        )


def _check_process_id(process_id: Any) -> str:
    """Only a string is looked up; one that is not an id of ours is unknown like any other."""
    if not isinstance(process_id, str):
        raise InvalidArgumentError("process_id must be a string")
    if not _PROCESS_ID.fullmatch(process_id):
        raise SessionNotFoundError(_unknown_message())
    return process_id


def _unknown_message() -> str:
    # The same words for every unknown id: an answer must not tell ids apart.
    return "no background process with this process_id in this session"


__all__ = [
    "ProcessInfo",
    "ProcessKillResult",
    "ProcessListResult",
    "ProcessOutputResult",
    "ProcessStartResult",
    "SessionProcesses",
]
