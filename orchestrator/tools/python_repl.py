"""The ``python_repl`` tool (seed 000's operations, plus ``history_context``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from orchestrator.errors import InvalidArgumentError
from orchestrator.session.repl.contexts import is_default
from orchestrator.tools._base import Fields, Operation, Tool, ToolArgs
from orchestrator.tools._env import CELL_ENV, SESSION_ENV_ON_CREATE

if TYPE_CHECKING:
    from orchestrator._core.repl_operations import PythonReplManager

__all__ = ["PYTHON_REPL"]

SESSION_ID = Field(description="The session to use; from an earlier call's `session_id`.")


class ExecuteArgs(ToolArgs):
    code: str = Field(description="Python code; the value of a final expression is returned.")
    session_id: str | None = Field(
        None, description="Session to run in; omit to create a new session."
    )
    timeout_s: float | None = Field(
        None, description="Seconds before the code is interrupted (policy default and maximum)."
    )
    policy: str | None = Field(
        None, description="Policy for a new session (only without session_id)."
    )
    session_env: dict[str, str] | None = Field(None, description=SESSION_ENV_ON_CREATE)
    env: dict[str, str] | None = Field(None, description=CELL_ENV)
    context: str | None = Field(
        None,
        description="Context to run in (needs session_id): an id from create_context, or a "
        "language's name (`bash`) for that language's own context; omit for the default one.",
    )


class CreateContextArgs(ToolArgs):
    session_id: str = SESSION_ID
    language: str = Field(
        "python", description="`python`, `bash`, `javascript`, `typescript`, `r`, `java`."
    )
    cwd: str | None = Field(None, description="Absolute working directory of the context.")


class ContextArgs(ToolArgs):
    session_id: str = SESSION_ID
    context: str = Field(description="A context id from create_context or list_contexts.")


class ReplSessionArgs(ToolArgs):
    session_id: str = SESSION_ID


class HistoryArgs(ToolArgs):
    session_id: str = SESSION_ID
    context: str | None = Field(
        None, description="A context's id: its own history; omit for the default context's."
    )


class InspectArgs(ToolArgs):
    session_id: str = SESSION_ID
    variable_name: str = Field(description="Name of a variable in the session.")


class HistoryContextArgs(ToolArgs):
    session_id: str = SESSION_ID
    max_tokens: int = Field(50_000, description="Token budget of the returned context.")


class NoArgs(ToolArgs):
    pass


async def _execute(orch: PythonReplManager, tenant: str | None, args: ExecuteArgs) -> Fields:
    started = time.time()
    if not is_default(args.context):
        return await _execute_in_context(orch, tenant, args, started)
    result = await orch.execute(
        args.code,
        session_id=args.session_id,
        timeout_s=args.timeout_s,
        policy=args.policy,
        tenant=tenant,
        session_env=args.session_env,
        env=args.env,
    )
    fields = result.model_dump()
    if denied := await orch.network_denied_since(result.session_id, started, tenant=tenant):
        fields["network_denied"] = denied
    return fields


async def _execute_in_context(
    orch: PythonReplManager, tenant: str | None, args: ExecuteArgs, started: float
) -> Fields:
    if args.session_id is None or args.policy is not None or args.session_env is not None:
        raise InvalidArgumentError(
            "context needs session_id (a context lives in a session), without policy or session_env"
        )
    result = await orch.execute_in_context(
        args.code,
        session_id=args.session_id,
        context=args.context,
        timeout_s=args.timeout_s,
        tenant=tenant,
        env=args.env,
    )
    fields = result.model_dump()
    if denied := await orch.network_denied_since(result.session_id, started, tenant=tenant):
        fields["network_denied"] = denied
    return fields


async def _create_context(
    orch: PythonReplManager, tenant: str | None, args: CreateContextArgs
) -> Fields:
    info = await orch.create_context(
        args.session_id, language=args.language, cwd=args.cwd, tenant=tenant
    )
    return {"session_id": args.session_id, "context": info.model_dump()}


async def _list_contexts(
    orch: PythonReplManager, tenant: str | None, args: ReplSessionArgs
) -> Fields:
    contexts = [c.model_dump() for c in orch.list_contexts(args.session_id, tenant=tenant)]
    return {"session_id": args.session_id, "contexts": contexts, "count": len(contexts)}


async def _restart_context(
    orch: PythonReplManager, tenant: str | None, args: ContextArgs
) -> Fields:
    info = await orch.restart_context(args.session_id, args.context, tenant=tenant)
    return {"session_id": args.session_id, "context": info.model_dump()}


async def _remove_context(orch: PythonReplManager, tenant: str | None, args: ContextArgs) -> Fields:
    info = await orch.remove_context(args.session_id, args.context, tenant=tenant)
    return {"session_id": args.session_id, "context": info.model_dump(), "removed": True}


async def _reset(orch: PythonReplManager, tenant: str | None, args: ReplSessionArgs) -> Fields:
    await orch.reset(args.session_id, tenant=tenant)
    return {"session_id": args.session_id}


async def _interrupt(orch: PythonReplManager, tenant: str | None, args: ReplSessionArgs) -> Fields:
    return (await orch.interrupt(args.session_id, tenant=tenant)).model_dump()


async def _destroy(orch: PythonReplManager, tenant: str | None, args: ReplSessionArgs) -> Fields:
    destroyed = await orch.destroy(args.session_id, tenant=tenant)
    return {"session_id": args.session_id, "destroyed": destroyed}


async def _list_sessions(orch: PythonReplManager, tenant: str | None, args: NoArgs) -> Fields:
    sessions = orch.list_sessions(tenant=tenant)
    return {"sessions": sessions, "count": len(sessions)}


async def _history(orch: PythonReplManager, tenant: str | None, args: HistoryArgs) -> Fields:
    if is_default(args.context):
        entries = orch.history(args.session_id, tenant=tenant)
    else:
        entries = orch.context_history(args.session_id, args.context, tenant=tenant)
    return {"session_id": args.session_id, "history": entries, "count": len(entries)}


async def _history_context(
    orch: PythonReplManager, tenant: str | None, args: HistoryContextArgs
) -> Fields:
    context = orch.history_context(args.session_id, args.max_tokens, tenant=tenant)
    return {"session_id": args.session_id, "context": context}


async def _inspect(orch: PythonReplManager, tenant: str | None, args: InspectArgs) -> Fields:
    info = await orch.inspect(args.session_id, args.variable_name, tenant=tenant)
    fields: dict[str, Any] = {"session_id": args.session_id, **info.model_dump()}
    if not info.found:
        fields |= {
            "success": False,
            "error_type": "invalid_argument",
            "error_message": f"no variable {args.variable_name!r} in the session",
        }
    return fields


async def _list_variables(
    orch: PythonReplManager, tenant: str | None, args: ReplSessionArgs
) -> Fields:
    listing = await orch.list_variables(args.session_id, tenant=tenant)
    variables = [v.model_dump() for v in listing.variables]
    return {
        "session_id": args.session_id,
        "variables": variables,
        "modules": listing.modules,
        "count": len(variables),
    }


PYTHON_REPL = Tool(
    name="python_repl",
    title="Python REPL",
    read_only_operations=frozenset(
        {
            "list_sessions",
            "history",
            "history_context",
            "inspect",
            "list_variables",
            "list_contexts",
        }
    ),
    open_world=True,
    description="Persistent Python sessions, each in its own container; state is kept.",
    operations={
        op.name: op
        for op in (
            Operation(
                "execute", "run code; no session_id: in a new session", ExecuteArgs, _execute
            ),
            Operation(
                "interrupt",
                "stop the running cell (state kept)",
                ReplSessionArgs,
                _interrupt,
            ),
            Operation("reset", "clear all state", ReplSessionArgs, _reset),
            Operation("destroy", "end the session", ReplSessionArgs, _destroy),
            Operation("list_sessions", "your sessions", NoArgs, _list_sessions),
            Operation("history", "the cells run", HistoryArgs, _history),
            Operation(
                "history_context",
                "the history as Markdown",
                HistoryContextArgs,
                _history_context,
            ),
            Operation("inspect", "one variable", InspectArgs, _inspect),
            Operation(
                "list_variables",
                "the variables",
                ReplSessionArgs,
                _list_variables,
            ),
            Operation(
                "create_context",
                "a new REPL context",
                CreateContextArgs,
                _create_context,
            ),
            Operation("list_contexts", "the contexts", ReplSessionArgs, _list_contexts),
            Operation("restart_context", "clear a context's state", ContextArgs, _restart_context),
            Operation("remove_context", "end a context", ContextArgs, _remove_context),
        )
    },
)
