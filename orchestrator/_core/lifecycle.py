"""When sessions end without being asked to: idle timeout, maximum lifetime, and eviction of the
least recently active idle session when the orchestrator is full (seed 000's rule).

Pure decisions here; the orchestrator acts on them and logs each teardown with its reason.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from orchestrator._core.owners import may_see
from orchestrator.session.session import Session

# Forget ended sessions after this many, oldest first: enough to answer a late call truthfully.
MAX_REMEMBERED_ENDINGS = 10_000
# The reaper wakes at a quarter of the shortest idle timeout, within these bounds.
MIN_REAP_INTERVAL = 0.5
MAX_REAP_INTERVAL = 30.0


def expiry_reason(session: Session, now: float | None = None) -> str | None:
    """Why ``session`` should end now, or None. A session in the middle of a call is not idle;
    one whose policy pauses idle sessions ends only at its maximum lifetime, or at the end a
    ``set_timeout`` gave it (never later than that maximum)."""
    now = time.monotonic() if now is None else now
    timeouts = session.policy.timeouts
    if now - session.started >= timeouts.max_lifetime_s:
        return f"maximum lifetime ({timeouts.max_lifetime_s:g} s) reached"
    ended = session.ends_at is not None and now >= session.ends_at
    if ended and session.lifetime_end_action == "end":
        return "maximum lifetime reached (the end set_timeout gave it)"
    idle = timeouts.idle_action == "destroy" and is_idle(session, now)
    if idle and not waits_for_resume(session):
        return f"idle for {timeouts.idle_s:g} s"
    return None


def lifetime_pause_due(session: Session, now: float | None = None) -> bool:
    """Whether the end ``set_timeout`` gave ``session`` has come and pauses it (its end action
    is ``pause``); its policy's maximum lifetime still ends it (``expiry_reason``)."""
    now = time.monotonic() if now is None else now
    return (
        session.lifetime_end_action == "pause"
        and session.ends_at is not None
        and now >= session.ends_at
    )


def waits_for_resume(session: Session) -> bool:
    """A paused session whose end action is ``pause`` waits for its resume, as E2B's paused
    sandboxes do: idleness does not end it, only its policy's maximum lifetime."""
    return session.paused and session.lifetime_end_action == "pause"


def should_pause(session: Session, now: float | None = None) -> bool:
    now = time.monotonic() if now is None else now
    return (
        session.policy.timeouts.idle_action == "pause"
        and not session.paused
        and is_idle(session, now)
    )


def is_idle(session: Session, now: float) -> bool:
    return not session.busy and now - session.last_active >= session.policy.timeouts.idle_s


def room_victim(
    sessions: Iterable[Session], *, starting: int, max_sessions: int, tenant: str, task: str | None
) -> Session | None:
    """At ``max_sessions`` (held and ``starting``), the caller's session a create ends to make
    room: its least recently active idle one (seed 000's rule), never another owner's; None
    when there is room, or nothing of its own to end (the create is then refused)."""
    held = list(sessions)
    if len(held) + starting < max_sessions:
        return None
    return eviction_candidate(s for s in held if s.tenant == tenant and may_see(s.task, task))


def eviction_candidate(sessions: Iterable[Session]) -> Session | None:
    """The least recently active session that is not in the middle of a call."""
    idle = [s for s in sessions if not s.busy and not s.closed]
    return min(idle, key=lambda s: s.last_active, default=None)


def reap_interval(
    sessions: Iterable[Session], default_idle_s: float, now: float | None = None
) -> float:
    """A quarter of the shortest idle timeout held, and no later than the nearest lifetime end
    still ahead: E2B's timeouts are seconds, and one a round late would be a quarter of an idle
    timeout late (up to ``MAX_REAP_INTERVAL``). An end already past waits for the next round
    (a call holds its session)."""
    now = time.monotonic() if now is None else now
    held = list(sessions)
    interval = min((s.policy.timeouts.idle_s for s in held), default=default_idle_s) / 4
    ahead = [s.ends_at - now for s in held if s.ends_at is not None and s.ends_at > now]
    if ahead:
        interval = min(interval, min(ahead))
    return max(MIN_REAP_INTERVAL, min(MAX_REAP_INTERVAL, interval))


class EndedSessions:
    """Recently ended sessions per owner, so their owner gets the reason (and whether the
    session was lost: its container died under it) and a second ``destroy`` succeeds; anyone
    else (another tenant, another task) still gets the plain not-found answer."""

    def __init__(self, capacity: int = MAX_REMEMBERED_ENDINGS) -> None:
        self._capacity = capacity
        # (tenant, session id) -> (owner task, reason, lost)
        self._reasons: OrderedDict[tuple[str, str], tuple[str | None, str, bool]] = OrderedDict()

    def record(self, session: Session, reason: str, *, lost: bool = False) -> None:
        self.record_ended(session.tenant, session.id, session.task, reason, lost=lost)

    def record_ended(
        self, tenant: str, session_id: str, task: str | None, reason: str, *, lost: bool
    ) -> None:
        self._reasons[(tenant, session_id)] = (task, reason, lost)
        while len(self._reasons) > self._capacity:
            self._reasons.popitem(last=False)

    def lost(self, tenant: str, session_id: str, task: str | None) -> bool:
        """Whether the caller's session (as ``reason`` would tell it) was lost."""
        found = self._reasons.get((tenant, session_id))
        return found is not None and (task is None or task == found[0]) and found[2]

    def reason(self, tenant: str, session_id: str, task: str | None) -> str | None:
        """Why the session ended, for a caller of ``tenant`` acting as ``task`` who could see
        it (the tenant itself, or its owner task); None for anyone else."""
        found = self._reasons.get((tenant, session_id))
        if found is None or not (task is None or task == found[0]):
            return None
        return found[1]
