"""The orchestrator's live sessions, who may see them, and the ids made inside them; every change
written through to the registry on disk (``store.Registry``), its settings (metadata, lifetime)
included.

Invariants: a caller sees a session only if it is its tenant's and, when the caller has a task,
that task's (``owners.may_see``); an unknown id and an id the caller may not see raise the same
``SessionNotFoundError``. A session is in the registry from the moment it is in the table until
just before its container is removed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator._core.lifecycle import EndedSessions
from orchestrator._core.owners import Grants, current_task, may_see
from orchestrator.errors import SessionLostError, SessionNotFoundError, StorageFullError
from orchestrator.policy.arguments import check_id, check_session_id
from orchestrator.registry.store import Registry, SessionRecord, SessionSettings
from orchestrator.session.history import HistoryEntry
from orchestrator.session.session import Session

log = logging.getLogger(__name__)

TERMINAL = "terminal"
PROCESS = "process"


def settings_of(session: Session) -> SessionSettings:
    """The session's settings as the registry keeps them: its end on the wall clock."""
    ends_at = None
    if session.ends_at is not None:
        ends_at = time.time() + (session.ends_at - time.monotonic())
    return SessionSettings(
        metadata=dict(session.metadata),
        ends_at=ends_at,
        lifetime_s=session.lifetime_s,
        end_action=session.lifetime_end_action,
    )


def restore_settings(session: Session, settings: SessionSettings | None) -> None:
    """A re-adopted session given its stored settings back. An end that passed while no
    orchestrator held it comes at the reaper's next round (it ends the session, or pauses it
    when that is its end action). One its end had paused (no end kept) runs again, as
    re-adoption thaws every container: as a resume does, that gives it its lifetime again."""
    if settings is None:
        return
    session.metadata = dict(settings.metadata)
    if settings.ends_at is not None:
        session.ends_at = time.monotonic() + (settings.ends_at - time.time())
    elif settings.end_action == "pause" and settings.lifetime_s is not None:
        session.ends_at = time.monotonic() + settings.lifetime_s
    session.lifetime_s = settings.lifetime_s
    if settings.end_action == "pause":
        session.lifetime_end_action = "pause"


class SessionTable:
    def __init__(self, store: Registry) -> None:
        self.store = store
        self.sessions: dict[str, Session] = {}
        self.grants = Grants()
        self._items: dict[tuple[str, str], str] = {}
        self._ended = EndedSessions()

    def __len__(self) -> int:
        return len(self.sessions)

    def add(self, session: Session) -> None:
        self.store.add_session(
            SessionRecord(
                id=session.id,
                tenant=session.tenant,
                task=session.task,
                policy_json=session.policy.model_dump_json(),
                container_id=session.container_id,
                worker_pid=session.repl.worker_pid,
                created_at=session.created_at.isoformat(),
                env=session.env,
            )
        )
        self.sessions[session.id] = session
        self._index_items_of(session)

    def adopt(self, session: Session, items: list[tuple[str, str]]) -> None:
        """A session re-adopted from the registry (its row is there already)."""
        self.sessions[session.id] = session
        for kind, item_id in items:
            self._items[(kind, item_id)] = session.id
        self._index_items_of(session)

    def _index_items_of(self, session: Session) -> None:
        """Every terminal and process the session starts, by whatever path, is found by id."""
        session.terminals.on_started = lambda item_id: self.remember(TERMINAL, item_id, session)
        session.processes.on_started = lambda item_id: self.remember(PROCESS, item_id, session)

    def save_settings(self, session: Session) -> None:
        """Write the session's metadata and lifetime (its end, the lifetime that end was set
        with, its end action) through to the registry, so a restart re-adopts it with them."""
        self.store.set_settings(session.id, settings_of(session))

    def remove(self, session: Session, reason: str, *, lost: bool = False) -> bool:
        """Take the session out (False if it was not in); its owner is told ``reason`` later,
        as ``session_lost`` when it was ``lost`` (its container died under it)."""
        if self.sessions.pop(session.id, None) is None:
            return False
        self._ended.record(session, reason, lost=lost)
        gone = {key for key, sid in self._items.items() if sid == session.id}
        for key in gone:
            del self._items[key]
        self.grants.forget_terminals({item for kind, item in gone if kind == TERMINAL})
        try:
            self.store.remove_session(session.id)
        except StorageFullError as exc:
            # The session ends whatever the disk says (its container goes next); the row left
            # behind names a container that will be gone, which the next start forgets.
            log.error("session %s: its registry row stays: %s", session.id, exc)
        return True

    def record_lost(self, record: SessionRecord, cause: str) -> None:
        """A session of the registry that could not be re-adopted at start (its container died
        while no orchestrator held it): its owner is told ``session_lost`` with ``cause``."""
        self._ended.record_ended(record.tenant, record.id, record.task, cause, lost=True)

    def ended_reason(self, tenant: str, session_id: str) -> str | None:
        return self._ended.reason(tenant, session_id, current_task())

    def find(self, session_id: Any, tenant: str) -> Session:
        """The caller's session; unknown and not-yours are indistinguishable. Its owner is told
        why a session that ended on its own (idle, lifetime, eviction) is gone."""
        check_session_id(session_id)
        session = self.sessions.get(session_id)
        task = current_task()
        if (
            session is None
            or session.tenant != tenant
            or not may_see(session.task, task)
            or self.grants.sealed(tenant, task)
        ):
            raise self.not_found(session_id, tenant)
        return session

    def not_found(self, session_id: str, tenant: str) -> SessionNotFoundError:
        """The answer for a session the caller cannot have: why it ended, if it ended on its
        own and the caller owned it, else nothing more than an unknown id would get."""
        task = current_task()
        ended = self._ended.reason(tenant, session_id, task)
        if ended is not None and self._ended.lost(tenant, session_id, task):
            return SessionLostError(f"session {session_id} was lost: {ended}", cause=ended)
        suffix = f" (it ended: {ended})" if ended else ""
        return SessionNotFoundError(f"session not found: {session_id}{suffix}")

    def visible(self, tenant: str) -> list[Session]:
        task = current_task()
        return [s for s in self.sessions.values() if s.tenant == tenant and may_see(s.task, task)]

    def owned_by(self, tenant: str, task: str) -> list[Session]:
        return [s for s in self.sessions.values() if s.tenant == tenant and s.task == task]

    # -- ids made inside sessions ----------------------------------------------------------

    def remember(self, kind: str, item_id: str, session: Session) -> None:
        self._items[(kind, item_id)] = session.id
        try:
            self.store.add_item(kind, item_id, session.id)
        except StorageFullError as exc:  # it started: only a restart would miss its row
            log.error("session %s: %s %s not in the registry: %s", session.id, kind, item_id, exc)

    def holder(self, kind: str, item_id: Any, tenant: str, action: str | None) -> Session:
        """The session holding ``item_id`` if the caller owns it, or (for a terminal) holds a
        grant for ``action`` on it; unknown and not-yours answer alike."""
        item_id = check_id(item_id, f"{kind}_id")
        session = self.sessions.get(self._items.get((kind, item_id), ""))
        task = current_task()
        granted = (
            session is not None
            and session.tenant == tenant
            and kind == TERMINAL
            and action is not None
            and not self.grants.sealed(tenant, task)
            and self.grants.allows(tenant, task, item_id, action)
        )
        if granted:
            assert session is not None
            return session
        try:
            return self.find(session.id if session else "-", tenant)
        except SessionNotFoundError:
            raise SessionNotFoundError(f"{kind} not found: {item_id}") from None

    # -- code history ----------------------------------------------------------------------

    def record_history(self, session: Session, entry: HistoryEntry) -> None:
        """Best effort: the cell has run, and its answer matters more than its history row."""
        try:
            self.store.add_history(session.id, entry, keep=session.policy.python.max_history)
        except StorageFullError as exc:
            log.error("session %s: a cell not kept in its history: %s", session.id, exc)

    def clear_history(self, session: Session) -> None:
        self.store.clear_history(session.id)
