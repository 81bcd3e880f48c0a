"""The python_repl operations (seed 000's, plus ``history_context`` and ``interrupt``) on the
manager's sessions: find or create the caller's session, take its turn, ask its Repl, keep the
code history (in memory and in the registry).

A call waits for its session's turn at most ``config.busy_timeout`` (``DEFAULT_BUSY_TIMEOUT``),
then answers ``busy`` naming the call that holds it and how long that has run. ``interrupt``
takes no turn: it is how a caller stops a cell whose client went away without a cancel (mcp 1.x
clients at their timeout). Every cell that ran is in the history, a cancelled one too.

``PythonReplManager`` is the session manager with these operations: a subclass, so the session
methods it calls are the manager's own, checked by the type checker, with nothing declared twice.
"""

from __future__ import annotations

from typing import Any

import anyio

from orchestrator._core.call_context import current_call
from orchestrator._core.manager import SessionManager
from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.arguments import (
    check_code,
    check_max_tokens,
    check_policy_name,
    check_variable,
)
from orchestrator.session.repl.cell_policy import check_cell
from orchestrator.session.repl.contexts import (
    DEFAULT_CONTEXT,
    ContextInfo,
    is_default,
    language_named,
)
from orchestrator.session.repl.interpreter import ExecuteOutcome, InterruptOutcome
from orchestrator.session.repl.protocol import InspectReply, ListVariablesReply
from orchestrator.session.session import Session

__all__ = ["ExecuteResult", "InterruptResult", "PythonReplManager"]


class ExecuteResult(ExecuteOutcome):
    session_id: str
    created_new_session: bool


class InterruptResult(InterruptOutcome):
    session_id: str
    # The call whose cell was stopped ("python_repl.execute"); None when none was running.
    running: str | None = None


class PythonReplManager(SessionManager):
    """The session manager and the python_repl operations on its sessions; what the tool layer
    takes, and what ``Orchestrator`` adds ``call()`` to."""

    async def execute(
        self,
        code: Any,
        *,
        session_id: Any = None,
        timeout_s: Any = None,
        policy: str | None = None,
        tenant: str | None = None,
        env: Any = None,
        session_env: Any = None,
    ) -> ExecuteResult:
        """Run ``code`` in the session (a new one without ``session_id``); ``env`` holds
        environment variables for this cell only. The cell's policy checks are its Repl's
        (``cell_policy``), made here too before a session is made or a turn waited for."""
        check_code(code)
        if session_id is None:  # refused before a session is made for it
            check_cell(self.policy(check_policy_name(policy)), code, timeout_s, env)
        session, created = await self.open_session(
            session_id, policy=policy, tenant=tenant, session_env=session_env
        )
        cell = session.repl.check(code, timeout_s, env)
        call = current_call()
        async with self._turn(session, "python_repl.execute"):
            interrupts = session.repl.interrupts
            try:
                outcome = await session.repl.execute(
                    code,
                    timeout=cell.timeout,
                    env=cell.env,
                    on_output=call.on_output if call else None,
                )
            except anyio.get_cancelled_exc_class():
                # The caller went (a cancel, a dropped connection): the cell was stopped with its
                # state kept, and what it did before is the session's now.
                self._record_cancelled(session, code)
                raise
        if session.repl.container_stopped:
            await self._lose_session(session, f"its container stopped: {outcome.error_message}")
        output = outcome.stdout + outcome.stderr
        if not outcome.success:
            output += f"{outcome.error_type}: {outcome.error_message}"
        cancelled = session.repl.interrupts != interrupts  # stopped by ``interrupt``
        entry = session.history.record(
            code, success=outcome.success, output=output, cancelled=cancelled
        )
        if not session.closed:
            self._table.record_history(session, entry)
        return ExecuteResult(
            **outcome.model_dump(), session_id=session.id, created_new_session=created
        )

    def _record_cancelled(self, session: Session, code: str) -> None:
        entry = session.history.record(
            code, success=False, output="cancelled by its caller", cancelled=True
        )
        if not session.closed:
            self._table.record_history(session, entry)

    async def interrupt(self, session_id: Any, *, tenant: str | None = None) -> InterruptResult:
        """Stop the cell running in the session, without waiting for the session's turn (the
        cell's call holds it): SIGINT, its state kept, or after the kill grace a fresh worker."""
        session = await self.session(session_id, tenant=tenant)
        running = session.running
        outcome = await session.repl.interrupt()
        return InterruptResult(
            **outcome.model_dump(),
            session_id=session.id,
            running=running[0] if running and outcome.interrupted else None,
        )

    async def reset(self, session_id: Any, *, tenant: str | None = None) -> None:
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "python_repl.reset"):
            await session.repl.reset()
            session.history.clear()
            self._table.clear_history(session)

    async def list_variables(
        self, session_id: Any, *, tenant: str | None = None
    ) -> ListVariablesReply:
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "python_repl.list_variables"):
            return await session.repl.list_variables()

    async def inspect(
        self, session_id: Any, variable_name: Any, *, tenant: str | None = None
    ) -> InspectReply:
        check_variable(variable_name)
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "python_repl.inspect"):
            return await session.repl.inspect(variable_name)

    def history(self, session_id: Any, *, tenant: str | None = None) -> list[dict[str, object]]:
        return [e.to_dict() for e in self.find_session(session_id, tenant=tenant).history.entries]

    def history_context(
        self, session_id: Any, max_tokens: Any = 50_000, *, tenant: str | None = None
    ) -> str:
        check_max_tokens(max_tokens)
        return self.find_session(session_id, tenant=tenant).history.context(max_tokens)

    # -- contexts: REPLs beside the default one (session/repl/contexts.py) ----------------------

    async def create_context(
        self,
        session_id: Any,
        *,
        language: Any = "python",
        cwd: Any = None,
        tenant: str | None = None,
    ) -> ContextInfo:
        """A new REPL context in the session: its own worker, state and cwd."""
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "python_repl.create_context"):
            return await session.contexts.create(language, cwd, env=session.env)

    def list_contexts(self, session_id: Any, *, tenant: str | None = None) -> list[ContextInfo]:
        """The session's contexts, the default one first."""
        session = self.find_session(session_id, tenant=tenant)
        return [ContextInfo(id=DEFAULT_CONTEXT, language="python"), *session.contexts.list()]

    async def restart_context(
        self, session_id: Any, context: Any, *, tenant: str | None = None
    ) -> ContextInfo:
        """A fresh worker for the context: its state and history gone, its cwd kept."""
        if is_default(context):
            await self.reset(session_id, tenant=tenant)
            return ContextInfo(id=DEFAULT_CONTEXT, language="python")
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "python_repl.restart_context"):
            return await session.contexts.restart(context)

    async def remove_context(
        self, session_id: Any, context: Any, *, tenant: str | None = None
    ) -> ContextInfo:
        """End the context's worker; the default context lives as long as its session."""
        if is_default(context):
            raise InvalidArgumentError("the default context cannot be removed; reset clears it")
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "python_repl.remove_context"):
            return await session.contexts.remove(context)

    async def execute_in_context(
        self,
        code: Any,
        *,
        session_id: Any,
        context: Any,
        timeout_s: Any = None,
        tenant: str | None = None,
        env: Any = None,
    ) -> ExecuteResult:
        """Run ``code`` in one of the session's contexts other than the default; a language's
        name (``bash``) is that language's own context, made on first use."""
        check_code(code)
        session = await self.session(session_id, tenant=tenant)
        cell = check_cell(session.policy, code, timeout_s, env)  # before waiting for the turn
        call = current_call()
        async with self._turn(session, "python_repl.execute"):
            if (language := language_named(context)) is not None:
                chosen = await session.contexts.for_language(language, env=session.env)
            else:
                chosen = session.contexts.get(context)
            outcome = await chosen.repl.execute(
                code,
                timeout=cell.timeout,
                env=cell.env,
                on_output=call.on_output if call else None,
            )
        if chosen.repl.container_stopped:
            await self._lose_session(session, f"its container stopped: {outcome.error_message}")
        output = outcome.stdout + outcome.stderr
        if not outcome.success:
            output += f"{outcome.error_type}: {outcome.error_message}"
        chosen.history.record(code, success=outcome.success, output=output)
        return ExecuteResult(
            **outcome.model_dump(), session_id=session.id, created_new_session=False
        )

    def context_history(
        self, session_id: Any, context: Any, *, tenant: str | None = None
    ) -> list[dict[str, object]]:
        session = self.find_session(session_id, tenant=tenant)
        return [e.to_dict() for e in session.contexts.get(context).history.entries]
