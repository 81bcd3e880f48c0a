"""One policy test case's operation, run through ``Orchestrator.call`` in a session of its own or
in a pooled one (see ``policy_tests`` for when and why). Every session opened here is destroyed
here: the pool's in :meth:`SessionPool.aclose`, a fresh one when its case ends."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import anyio

from orchestrator._api import Orchestrator
from orchestrator.policy.model import Policy
from orchestrator.policy_ci.cases import PolicyCase
from orchestrator.policy_ci.diff import CRITICAL_MODULES, HIGH_RISK_MODULES
from orchestrator.policy_ci.outcomes import Outcome
from orchestrator.session.processes import MAX_TAIL_LINES
from orchestrator.tools import TOOLS
from orchestrator.worker.modpolicy import ModulePolicy

__all__ = ["CaseError", "SessionPool", "poolable", "run_operation"]

# A destroy is a SIGKILL and a container removal; an engine slower than this is stuck.
DESTROY_TIMEOUT = 30.0
# How often a background process is asked whether it has exited; the process tool has no wait.
PROCESS_POLL_INTERVAL = 0.1
# Only code refused by the static rules never ran: its session needs no reset.
_STATIC_REFUSALS = frozenset({"validation", "import_blocked"})


class CaseError(Exception):
    """The case could not be run as written: no session could be opened, or a setup failed."""


class SessionPool:
    """Idle sessions of one policy, for ``python`` cases that need no setup; only used when the
    policy is :func:`poolable`."""

    def __init__(self, orchestrator: Orchestrator, name: str, jobs: int, run_id: str) -> None:
        policy = orchestrator.policy(name)
        self.enabled = poolable(policy)
        self._orchestrator = orchestrator
        self._name = name
        self._tenant = f"policy-test-{run_id}-pool-{name}"
        self._limiter = anyio.CapacityLimiter(min(jobs, policy.limits.max_sessions_per_owner))
        self._idle: list[str] = []

    async def run_python(self, case: PolicyCase) -> Outcome:
        async with self._limiter:
            session_id = self._idle.pop() if self._idle else None
            result = await self._execute(case, session_id)
            if session_id is not None and result.get("error_type") == "session_not_found":
                session_id = None
                result = await self._execute(case, None)
            session_id = result.get("session_id") or session_id
            if session_id is not None:
                await self._give_back(session_id, ran=not _refused_before_running(result))
            return Outcome.of(result)

    async def _execute(self, case: PolicyCase, session_id: str | None) -> dict[str, Any]:
        arguments: dict[str, Any] = {"operation": "execute", "code": case.python}
        arguments |= {"session_id": session_id} if session_id else {"policy": self._name}
        if case.timeout_s is not None:
            arguments["timeout_s"] = case.timeout_s
        return await self._call(arguments)

    async def _give_back(self, session_id: str, *, ran: bool) -> None:
        if (
            ran
            and not (await self._call({"operation": "reset", "session_id": session_id}))["success"]
        ):
            await _destroy(self._orchestrator, [session_id], self._tenant)
            return
        self._idle.append(session_id)

    async def _call(self, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self._orchestrator.call("python_repl", arguments, tenant=self._tenant)
        return result.structured

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        await _destroy(self._orchestrator, idle, self._tenant)


def poolable(policy: Policy) -> bool:
    """Whether code under ``policy`` leaves nothing behind but interpreter state: restricted, no
    ``open``, and no allowed module that reaches files, processes or the network."""
    python = policy.python
    if python.mode != "restricted" or "open" not in python.forbidden_builtins:
        return False
    modules = ModulePolicy(frozenset(python.allowed_modules), frozenset(python.forbidden_modules))
    return all(modules.refusal(name) is not None for name in CRITICAL_MODULES | HIGH_RISK_MODULES)


def _refused_before_running(result: Mapping[str, Any]) -> bool:
    return result.get("error_type") in _STATIC_REFUSALS and bool(result.get("violations"))


async def run_operation(
    orchestrator: Orchestrator, case: PolicyCase, name: str, pool: SessionPool, *, tenant: str
) -> Outcome:
    """What ``case`` gets under the policy called ``name``."""
    if case.kind == "python" and not case.setup and pool.enabled:
        return await pool.run_python(case)
    async with FreshSession(orchestrator, name, tenant) as session:
        return await session.run(case)


class FreshSession:
    """The sessions one case opens (by its own call or by ours), destroyed when it ends."""

    def __init__(self, orchestrator: Orchestrator, name: str, tenant: str) -> None:
        self._orchestrator = orchestrator
        self._name = name
        self._tenant = tenant
        self._opened: list[str] = []

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await _destroy(self._orchestrator, self._opened, self._tenant)

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = (await self._orchestrator.call(tool, arguments, tenant=self._tenant)).structured
        if result.get("created_new_session") and isinstance(result.get("session_id"), str):
            self._opened.append(result["session_id"])
        return result

    async def run(self, case: PolicyCase) -> Outcome:
        session_id = None
        if case.setup or case.kind in ("process", "read", "write", "call"):
            session_id = await self._open()
        for command in case.setup:
            await self._setup(command, session_id)
        where: dict[str, Any] = {"session_id": session_id} if session_id else {"policy": self._name}
        timeout = {} if case.timeout_s is None else {"timeout_s": case.timeout_s}
        confirm = {"confirm_dangerous": True} if case.confirm_dangerous else {}
        if case.python is not None:
            execute = {"operation": "execute", "code": case.python, **where, **timeout}
            return Outcome.of(await self.call("python_repl", execute))
        if case.command is not None:
            run = {"operation": "run", "command": case.command, **where, **timeout, **confirm}
            return Outcome.of(await self.call("terminal", run))
        assert session_id is not None
        if case.process is not None:
            return await self._process(case.process, session_id, confirm, case.timeout_s)
        if case.read is not None:
            read = {"operation": "read", "session_id": session_id, "path": case.read}
            return Outcome.of(await self.call("files", read), stdout_key="content")
        if case.write is not None:
            write = {"operation": "write", "session_id": session_id, "path": case.write}
            return Outcome.of(await self.call("files", write | {"content": case.content}))
        assert case.call is not None
        return Outcome.of(await self._raw_call(case.call, session_id))

    async def _open(self) -> str:
        opened = await self.call(
            "python_repl", {"operation": "execute", "code": "None", "policy": self._name}
        )
        if not opened["success"]:
            reason = f"{opened.get('error_type')}: {opened.get('error_message')}"
            raise CaseError(f"could not open a session of {self._name!r}: {reason}")
        return str(opened["session_id"])

    async def _setup(self, command: str, session_id: str | None) -> None:
        run = {"operation": "run", "command": command, "session_id": session_id}
        done = await self.call("terminal", run)
        if not done["success"] or done.get("exit_code") != 0:
            why = done.get("error_message") or f"exit {done.get('exit_code')}: {done.get('stdout')}"
            raise CaseError(f"setup {command!r} failed: {why}")

    async def _process(
        self, command: str, session_id: str, confirm: dict[str, bool], timeout_s: float | None
    ) -> Outcome:
        start = {"operation": "start", "command": command, "session_id": session_id, **confirm}
        started = await self.call("process", start)
        if not started["success"]:
            return Outcome.of(started)
        process_id = started["process_id"]
        timeout = timeout_s or self._orchestrator.policy(self._name).timeouts.command_s
        exit_code = await self._exit_code(process_id, session_id, timeout)
        tail = {"operation": "read_output", "process_id": process_id, "tail": MAX_TAIL_LINES}
        output = await self.call("process", tail)
        return Outcome(allowed=True, exit_code=exit_code, stdout=str(output.get("output", "")))

    async def _exit_code(self, process_id: str, session_id: str, timeout: float) -> int | None:
        """The exit code once the process has ended; None if it still runs after ``timeout``."""
        listing = {"operation": "list", "session_id": session_id}
        with anyio.move_on_after(timeout):
            while True:
                found = (await self.call("process", listing)).get("processes", [])
                mine = [p for p in found if p.get("process_id") == process_id]
                if mine and mine[0].get("state") != "running":
                    code = mine[0].get("exit_code")
                    return code if isinstance(code, int) else None
                await anyio.sleep(PROCESS_POLL_INTERVAL)
        return None

    async def _raw_call(self, call: dict[str, Any], session_id: str) -> dict[str, Any]:
        arguments = {key: value for key, value in call.items() if key != "tool"}
        tool = TOOLS[call["tool"]]
        takes_session = "session_id" in tool.operations[arguments["operation"]].args.model_fields
        if takes_session and "session_id" not in arguments and "policy" not in arguments:
            arguments["session_id"] = session_id
        return await self.call(tool.name, arguments)


async def _destroy(orchestrator: Orchestrator, session_ids: list[str], tenant: str) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(DESTROY_TIMEOUT):
        for session_id in session_ids:
            destroy = {"operation": "destroy", "session_id": session_id}
            await orchestrator.call("python_repl", destroy, tenant=tenant)
