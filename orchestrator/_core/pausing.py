"""Pausing sessions: a session's container frozen (cgroup freezer) between its calls, and thawed by
its next call or a resume.

A session is paused on request (``pause``), by the reaper when it is idle and its policy says so
(``pause_if_idle``), or at the end of its lifetime when its end action is ``pause``
(``pause_at_lifetime_end``: E2B's auto-pause). Such a session waits for its resume with its
deadline cleared; the thaw gives it its last lifetime again (``session_control.renew_lifetime``),
as E2B's resume gives a fresh timeout.

Invariants: freezing and thawing a session take its ``state_lock``, so two never interleave; a
session in the middle of a call is never frozen (a request is ``busy``, the reaper waits for its
next round), and idleness is judged again under the lock, so a call that has just thawed the
session is not frozen in its stride.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator._core.lifecycle import should_pause
from orchestrator._core.session_control import renew_lifetime
from orchestrator.backend.base import Backend
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    BusyError,
    ContainerNotFoundError,
    OrchestratorError,
)
from orchestrator.session.session import Session

__all__ = ["Pausing"]

log = logging.getLogger(__name__)


class Pausing:
    def __init__(
        self, backend: Backend, *, lifetime_changed: Callable[[Session], None] | None = None
    ) -> None:
        self._backend = backend
        # Told when a pause or a thaw changed a session's end (to keep it in the registry).
        self._lifetime_changed = lifetime_changed

    async def pause(self, session: Session) -> bool:
        """Freeze the session's container; False if it was already paused. A session in the
        middle of a call is ``busy``: freezing it would stall that call."""
        async with session.state_lock:
            if session.paused:
                return False
            if session.busy:
                raise BusyError(f"session {session.id} is in the middle of a call")
            await self._backend.pause(session.container_id)
            session.paused = True
        log.info("session %s paused", session.id)
        return True

    async def pause_if_idle(self, session: Session) -> None:
        """The reaper's pause of an idle session whose policy pauses idle sessions."""
        async with session.state_lock:
            if session.paused or not should_pause(session):
                return
            await self._backend.pause(session.container_id)
            session.paused = True
        log.info("session %s paused: idle", session.id)

    async def pause_at_lifetime_end(self, session: Session) -> bool:
        """The reaper's pause of a session whose lifetime ended and whose end action is
        ``pause``: frozen (unless a call holds it: the next round tries again) and its deadline
        cleared, so it waits for its resume. Whether it is now waiting."""
        async with session.state_lock:
            if session.busy:
                return False
            if not session.paused:
                await self._backend.pause(session.container_id)
                session.paused = True
            session.ends_at = None
        self._changed(session)
        log.info("session %s paused: its lifetime ended (end action pause)", session.id)
        return True

    async def thaw(self, session: Session) -> bool:
        """Thaw a paused session (False if it was running), with a fresh lifetime when it was
        waiting for its resume. A container the engine stopped while it was frozen is
        ``container_not_found``: the session is lost."""
        async with session.state_lock:
            if not session.paused:
                return False
            try:
                await self._backend.unpause(session.container_id)
            except (BackendUnavailableError, ContainerNotFoundError):
                raise
            except BackendError as exc:
                # The engine says it is not paused: an engine restart stopped it (or someone
                # thawed it from outside). A stopped one is lost, which the caller is told.
                state = await self._backend.container_state(session.container_id)
                if not state.running:
                    raise ContainerNotFoundError(
                        f"its container stopped while paused: {exc}"
                    ) from exc
            session.paused = False
            renewed = renew_lifetime(session)
        if renewed:
            self._changed(session)
        session.touch()
        return True

    def _changed(self, session: Session) -> None:
        if self._lifetime_changed is None:
            return
        try:
            self._lifetime_changed(session)
        except OrchestratorError as exc:  # a full disk: the session's end holds in memory
            log.warning("session %s: its new end was not kept: %s", session.id, exc)
