"""The python_repl operations (seed 000's, plus ``history_context``) on the manager's sessions:
find or create the caller's session, take its turn, ask its Repl, keep the code history (in
memory and in the registry).

``PythonReplManager`` is the session manager with these operations: a subclass, so the session
methods it calls are the manager's own, checked by the type checker, with nothing declared twice.
"""

from __future__ import annotations

from typing import Any

from orchestrator._core.call_context import current_call
from orchestrator._core.manager import SessionManager
from orchestrator.policy.arguments import (
    check_code,
    check_max_tokens,
    check_policy_name,
    check_timeout,
    check_variable,
)
from orchestrator.policy.env import check_env
from orchestrator.session.repl.interpreter import ExecuteOutcome
from orchestrator.session.repl.protocol import InspectReply, ListVariablesReply

__all__ = ["ExecuteResult", "PythonReplManager"]


class ExecuteResult(ExecuteOutcome):
    session_id: str
    created_new_session: bool


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
        environment variables for this cell only."""
        check_code(code)
        if session_id is None:  # refused before a session is made for it
            chosen = self.policy(check_policy_name(policy))
            check_timeout(timeout_s, chosen)
            check_env(env, chosen)
        session, created = await self.open_session(
            session_id, policy=policy, tenant=tenant, session_env=session_env
        )
        timeout = check_timeout(timeout_s, session.policy)
        cell_env = check_env(env, session.policy)
        call = current_call()
        async with self._turn(session):
            outcome = await session.repl.execute(
                code, timeout=timeout, env=cell_env, on_output=call.on_output if call else None
            )
        if session.repl.container_stopped:
            await self.lose_session(session, f"its container stopped: {outcome.error_message}")
        output = outcome.stdout + outcome.stderr
        if not outcome.success:
            output += f"{outcome.error_type}: {outcome.error_message}"
        entry = session.history.record(code, success=outcome.success, output=output)
        if not session.closed:
            self._table.record_history(session, entry)
        return ExecuteResult(
            **outcome.model_dump(), session_id=session.id, created_new_session=created
        )

    async def reset(self, session_id: Any, *, tenant: str | None = None) -> None:
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session):
            await session.repl.reset()
            session.history.clear()
            self._table.clear_history(session)

    async def list_variables(
        self, session_id: Any, *, tenant: str | None = None
    ) -> ListVariablesReply:
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session):
            return await session.repl.list_variables()

    async def inspect(
        self, session_id: Any, variable_name: Any, *, tenant: str | None = None
    ) -> InspectReply:
        check_variable(variable_name)
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session):
            return await session.repl.inspect(variable_name)

    def history(self, session_id: Any, *, tenant: str | None = None) -> list[dict[str, object]]:
        return [e.to_dict() for e in self.find_session(session_id, tenant=tenant).history.entries]

    def history_context(
        self, session_id: Any, max_tokens: Any = 50_000, *, tenant: str | None = None
    ) -> str:
        check_max_tokens(max_tokens)
        return self.find_session(session_id, tenant=tenant).history.context(max_tokens)
