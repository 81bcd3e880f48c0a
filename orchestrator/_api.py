"""The Python API: ``Orchestrator`` is the session manager (``_core``) plus ``call()``, the one
entry every interface uses for a tool call, and its audit record. The tool layer sits between the
two: it takes the manager and knows nothing of who called it, and the manager never imports it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from orchestrator._core.call_context import CallContext, call_scope, new_call_id
from orchestrator._core.config import OrchestratorConfig
from orchestrator._core.metrics import call_outcome_label
from orchestrator._core.owners import check_task, task_scope
from orchestrator._core.repl_operations import ExecuteResult, PythonReplManager
from orchestrator.audit.records import call_outcome
from orchestrator.backend.base import Backend
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.tools import TOOLS, ToolResult, call_tool

__all__ = ["ExecuteResult", "Orchestrator", "OrchestratorConfig"]

log = logging.getLogger(__name__)
# One line per call (INFO): tool, operation, outcome and duration, under the call's id.
call_log = logging.getLogger("orchestrator.calls")


def _session_argument(arguments: Any) -> str | None:
    session_id = arguments.get("session_id") if isinstance(arguments, dict) else None
    return session_id if isinstance(session_id, str) else None


class Orchestrator(PythonReplManager):
    """Sessions, and the tools over them: ``await orch.call("python_repl", {...})``."""

    def __init__(
        self, config: OrchestratorConfig | None = None, *, backend: Backend | None = None
    ) -> None:
        super().__init__(config, backend=backend)
        self.metrics.name_operations({name: tool.operations for name, tool in TOOLS.items()})

    async def call(
        self,
        tool: Any,
        arguments: Any,
        *,
        tenant: str | None = None,
        task: Any = None,
        call_id: str | None = None,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> ToolResult:
        """One tool call as every interface makes it: ``{operation, ...}`` in, a result out, for
        ``tenant`` and optionally one ``task`` of it. Every call, refused ones included, goes
        into the audit log when one is kept; a call cancelled before its answer (its code may
        well have run) as ``cancelled``. ``call_id`` (default: a new one, ``new_call_id``)
        names the call in its audit record and in what is logged while it runs.

        ``on_stdout`` and ``on_stderr`` get the code's output as it comes, while the call runs
        (``python_repl`` ``execute``); the result still holds all of it. They are called from
        the call's task between reads of the stream: keep them quick."""
        started = time.perf_counter()
        context = CallContext(
            call_id or new_call_id(),
            tenant or self.config.tenant,
            _session_argument(arguments),
            on_output=_output_listener(on_stdout, on_stderr),
        )
        with call_scope(context):
            return await self._call(tool, arguments, tenant, task, context, started)

    async def _call(
        self,
        tool: Any,
        arguments: Any,
        tenant: str | None,
        task: Any,
        context: CallContext,
        started: float,
    ) -> ToolResult:
        found = TOOLS.get(tool) if isinstance(tool, str) else None
        result: ToolResult | None = None
        try:
            try:
                task = check_task(task)
            except InvalidArgumentError as exc:
                result = ToolResult({"success": False, **exc.to_dict()}, str(exc))
                task = None
            else:
                if found is None:
                    error = InvalidArgumentError(f"tool must be one of: {', '.join(TOOLS)}")
                    result = ToolResult({"success": False, **error.to_dict()}, str(error))
                else:
                    if self._audit is not None:
                        await self._audit_begin(found.name, arguments, tenant, context)
                    with task_scope(task):
                        result = await call_tool(self, found, arguments, tenant=tenant)
        finally:
            seconds = time.perf_counter() - started
            self._count_call(tool, arguments, tenant, result, seconds)
            if self._audit is not None:  # on every path, a cancel's too (recording is shielded)
                await self._audit_call(tool, arguments, tenant, task, result, seconds, context)
        return result

    def _count_call(
        self,
        tool: Any,
        arguments: Any,
        tenant: str | None,
        result: ToolResult | None,
        seconds: float,
    ) -> None:
        structured = None if result is None else result.structured
        operation = arguments.get("operation") if isinstance(arguments, dict) else None
        outcome = call_outcome_label(structured)
        self.metrics.record_call(tool, operation, outcome, seconds)
        if outcome == "quota_exceeded" and structured is not None:
            quota = structured.get("quota")
            self.metrics.refused_for_quota(tenant or self.config.tenant, quota)
        if call_log.isEnabledFor(logging.INFO):
            tool_label, operation_label = self.metrics.call_labels(tool, operation)
            session_id = (structured or {}).get("session_id")
            call_log.info(
                "%s.%s: %s in %.1f ms", tool_label, operation_label, outcome, seconds * 1000,
                extra={
                    "tool": tool_label, "operation": operation_label, "outcome": outcome,
                    "duration_ms": round(seconds * 1000, 3),
                    "session": session_id if isinstance(session_id, str) else None,
                },
            )  # fmt: skip

    async def _audit_begin(
        self, tool: str, arguments: Any, tenant: str | None, context: CallContext
    ) -> None:
        """The record that the call begins; its end is ``_audit_call``'s."""
        assert self._audit is not None
        args = arguments if isinstance(arguments, dict) else {}
        operation, session_id = args.get("operation"), args.get("session_id")
        try:
            await self._audit.record_begin(
                tenant=tenant or self.config.tenant,
                tool=tool,
                operation=str(operation)[:64] if operation is not None else None,
                session_id=session_id if isinstance(session_id, str) else None,
                call_id=context.call_id,
            )
        except OrchestratorError as exc:
            log.error("audit log could not record the start of %s.%s: %s", tool, operation, exc)

    async def _audit_call(
        self,
        tool: Any,
        arguments: Any,
        tenant: str | None,
        task: str | None,
        result: ToolResult | None,
        seconds: float,
        context: CallContext,
    ) -> None:
        """One call's record; ``result`` None is a call that ended without one: cancelled."""
        assert self._audit is not None
        args = arguments if isinstance(arguments, dict) else {"arguments": repr(arguments)[:200]}
        if result is None:
            structured = {"operation": args.get("operation"), "error_type": "cancelled"}
        else:
            structured = result.structured
        session_id = structured.get("session_id") or args.get("session_id")
        try:
            await self._audit.record(
                tenant=tenant or self.config.tenant,
                task=task if isinstance(task, str) else None,
                tool=str(tool)[:64],
                operation=str(structured.get("operation"))[:64],
                session_id=session_id if isinstance(session_id, str) else None,
                arguments=args,
                **call_outcome(str(tool), structured, answered=result is not None),
                duration_ms=round(seconds * 1000, 3),
                outcome="cancelled" if result is None else None,
                call_id=context.call_id,
                egress=context.egress,
            )
        except OrchestratorError as exc:
            # The call has happened; refusing its answer now would not undo it. Say it loudly.
            log.error(
                "audit log could not record %s.%s: %s", tool, structured.get("operation"), exc
            )


def _output_listener(
    on_stdout: Callable[[str], None] | None, on_stderr: Callable[[str], None] | None
) -> Callable[[str, str], None] | None:
    if on_stdout is None and on_stderr is None:
        return None
    targets = {"stdout": on_stdout, "stderr": on_stderr}

    def listener(name: str, text: str) -> None:
        target = targets[name]
        if target is not None:
            target(text)

    return listener
