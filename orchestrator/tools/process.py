"""The ``process`` tool (seed 003's background processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from orchestrator.tools._base import Fields, Operation, Tool, ToolArgs
from orchestrator.tools._env import CALL_ENV

if TYPE_CHECKING:
    from orchestrator._core.manager import SessionManager

__all__ = ["PROCESS_TOOL"]

PROCESS = "process"


class ProcessStartArgs(ToolArgs):
    command: str = Field(description="Shell command line to run in the background (bash -c).")
    session_id: str = Field(description="The session to run it in.")
    cwd: str | None = Field(None, description="Working directory under /workspace.")
    env: dict[str, str] | None = Field(None, description=CALL_ENV)
    confirm_dangerous: bool = Field(
        False, description="Confirm a command the policy marks as dangerous."
    )


class ProcessListArgs(ToolArgs):
    session_id: str | None = Field(None, description="Only this session's processes.")


class ReadOutputArgs(ToolArgs):
    process_id: str = Field(description="A process id from `start`.")
    tail: int = Field(100, description="How many of the last lines to return.")


class ProcessKillArgs(ToolArgs):
    process_id: str = Field(description="A process id from `start`.")


async def _start(orch: SessionManager, tenant: str | None, args: ProcessStartArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    result = await session.processes.start(
        args.command, cwd=args.cwd, env=args.env, confirm_dangerous=args.confirm_dangerous
    )
    return {"session_id": session.id, **result.model_dump()}


async def _list(orch: SessionManager, tenant: str | None, args: ProcessListArgs) -> Fields:
    if args.session_id is not None:
        sessions = [await orch.session(args.session_id, tenant=tenant)]
    else:
        sessions = [
            await orch.session(s["session_id"], tenant=tenant)
            for s in orch.list_sessions(tenant=tenant)
        ]
    processes = []
    for session in sessions:
        listing = await session.processes.list()
        processes += [{"session_id": session.id, **p.model_dump()} for p in listing.processes]
    return {"processes": processes, "count": len(processes)}


async def _read_output(orch: SessionManager, tenant: str | None, args: ReadOutputArgs) -> Fields:
    session = await orch.session_of(PROCESS, args.process_id, tenant=tenant)
    result = await session.processes.read_output(args.process_id, tail=args.tail)
    return {"session_id": session.id, **result.model_dump()}


async def _kill(orch: SessionManager, tenant: str | None, args: ProcessKillArgs) -> Fields:
    session = await orch.session_of(PROCESS, args.process_id, tenant=tenant)
    result = await session.processes.kill(args.process_id)
    return {"session_id": session.id, **result.model_dump()}


PROCESS_TOOL = Tool(
    name="process",
    title="Background processes",
    read_only_operations=frozenset({"list", "read_output"}),
    open_world=True,
    description="Background processes (servers, watchers) in a session.",
    operations={
        op.name: op
        for op in (
            Operation("start", "start a command", ProcessStartArgs, _start),
            Operation("list", "state, exit code, ports", ProcessListArgs, _list),
            Operation("read_output", "its last lines", ReadOutputArgs, _read_output),
            Operation("kill", "end it", ProcessKillArgs, _kill),
        )
    },
)
