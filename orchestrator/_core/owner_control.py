"""What an owner task does to its own: ``share`` one of its terminals with another task of its
tenant, and ``close_owner`` (end everything a task owns and seal it). The rules are ``owners``';
this object applies them to the session table.

Invariants: only a terminal's owner task shares it, never with itself, and a grantee cannot pass
it on; a task closes only itself (or its tenant closes it), and a closed task is sealed before
its sessions end, so nothing new is made for it meanwhile; closing is bounded, and says whether
it converged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from orchestrator._core.owners import SHARE_ACTIONS, check_task, current_task
from orchestrator._core.quotas import Admission
from orchestrator._core.session_table import SessionTable
from orchestrator.errors import InvalidArgumentError, SessionNotFoundError
from orchestrator.session.session import Session

__all__ = ["OwnerControl"]

log = logging.getLogger(__name__)


class OwnerControl:
    def __init__(
        self,
        table: SessionTable,
        admission: Admission,
        *,
        end_session: Callable[[Session, str], Awaitable[None]],
        close_timeout: float,
    ) -> None:
        self._table = table
        self._admission = admission
        self._end_session = end_session
        self._close_timeout = close_timeout

    def share(self, terminal_id: Any, task: Any, actions: Any, tenant: str) -> list[str]:
        """Grant ``actions`` on one of the calling task's terminals to another task of the same
        tenant."""
        grantee = check_task(task, "task")
        owner = current_task()
        if owner is None or grantee is None:
            raise InvalidArgumentError("share is made by a task, to another task")
        if grantee == owner:
            raise InvalidArgumentError("task must be another task than the caller's")
        if not isinstance(actions, list) or not actions or not set(actions) <= SHARE_ACTIONS:
            raise InvalidArgumentError(
                f"actions must be a non-empty list of {sorted(SHARE_ACTIONS)}"
            )
        session = self._table.holder("terminal", terminal_id, tenant, action=None)
        assert isinstance(terminal_id, str)
        self._table.grants.grant(tenant, grantee, terminal_id, frozenset(actions))
        log.info(
            "%s/%s shared %s of session %s with %s", tenant, owner, actions, session.id, grantee
        )
        return sorted(actions)

    async def close(self, task: Any, tenant: str) -> dict[str, Any]:
        """End everything a task owns and seal it: its grants go, calls in flight for it fail
        at their next check, and no new session is made for it. Reports whether it converged
        (every session of the task ended within ``close_timeout``)."""
        closing = check_task(task, "task")
        caller = current_task()
        if closing is None:
            raise InvalidArgumentError("task is required")
        if caller is not None and caller != closing:
            raise SessionNotFoundError(f"task not found: {closing}")
        self._table.grants.seal(tenant, closing)
        ended = 0
        with anyio.move_on_after(self._close_timeout):
            for session in self._table.owned_by(tenant, closing):
                await self._end_session(session, f"its owner task {closing} was closed")
                ended += 1
        left = len(self._table.owned_by(tenant, closing))
        starting = self._admission.starting(tenant, closing)
        return {"task": closing, "sessions_ended": ended, "converged": left == 0 and not starting}
