"""The ``session`` tool: operations on a whole session beyond the four contract tools."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from orchestrator.tools._base import Fields, Operation, Tool, ToolArgs

if TYPE_CHECKING:
    from orchestrator.orchestrator import Orchestrator


class SessionArgs(ToolArgs):
    session_id: str = Field(description="The session.")


async def _pause(orch: Orchestrator, tenant: str | None, args: SessionArgs) -> Fields:
    changed = await orch.pause(args.session_id, tenant=tenant)
    return {"session_id": args.session_id, "paused": True, "changed": changed}


async def _resume(orch: Orchestrator, tenant: str | None, args: SessionArgs) -> Fields:
    changed = await orch.resume(args.session_id, tenant=tenant)
    return {"session_id": args.session_id, "paused": False, "changed": changed}


SESSION_TOOL = Tool(
    name="session",
    description=(
        "Whole-session operations: pause freezes every process of a session (its state and "
        "files kept); resume thaws it. Any other call on a paused session resumes it too."
    ),
    operations={
        op.name: op
        for op in (
            Operation("pause", "freeze the session until its next call", SessionArgs, _pause),
            Operation("resume", "thaw a paused session", SessionArgs, _resume),
        )
    },
)
