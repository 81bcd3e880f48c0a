"""The reaper: a background loop that, each round, ends sessions past their idle timeout or their
lifetime, pauses the idle ones whose policy says so (and those whose lifetime's end action is
``pause``), reads the egress proxies (``egress_round``), sweeps unused snapshot images, and
reconciles the engine's containers with the sessions held (``reconciler``).

Invariants: a round sleeps first, a quarter of the shortest idle timeout held or until the
nearest lifetime end (``lifecycle``; ``wake`` after a new lifetime measures it again, only ever
sooner), never longer than the configured interval; one session's engine error skips that
session this round, never the round; a session with running work (a process or a listening port,
when its policy counts them) is not idle, whatever the clock says; the loop runs in the
orchestrator's task group until ``cancel`` (first thing at shutdown: a reconcile would take
sessions being let go for orphans).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from orchestrator._core.egress_round import EgressAccounting
from orchestrator._core.lifecycle import (
    expiry_reason,
    lifetime_pause_due,
    reap_interval,
    should_pause,
)
from orchestrator._core.pausing import Pausing
from orchestrator._core.snapshots import Snapshots
from orchestrator.errors import BackendError
from orchestrator.registry.reconcile import ReconcileReport
from orchestrator.session.session import Session

__all__ = ["Reaper"]

log = logging.getLogger(__name__)


class Reaper:
    def __init__(
        self,
        *,
        sessions: Callable[[], list[Session]],
        default_idle_s: Callable[[], float],
        max_interval: float,
        end_session: Callable[[Session, str], Awaitable[None]],
        pausing: Pausing,
        egress: EgressAccounting,
        snapshots: Snapshots,
        reconcile: Callable[[], Awaitable[ReconcileReport]],
    ) -> None:
        self._sessions = sessions
        # The default policy's idle timeout: the round's pace when no session is held.
        self._default_idle_s = default_idle_s
        self._max_interval = max_interval
        self._end_session = end_session
        self._pausing = pausing
        self._egress = egress
        self._snapshots = snapshots
        self._reconcile = reconcile
        # Made in start(): a cancel scope belongs to an event loop, and this may run outside one.
        self._scope: anyio.CancelScope | None = None
        # Set by wake(); made in _run, in the loop it belongs to.
        self._woken: anyio.Event | None = None

    @property
    def started(self) -> bool:
        return self._scope is not None

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._scope = anyio.CancelScope()
        task_group.start_soon(self._run, self._scope)

    def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def wake(self) -> None:
        """A lifetime was set: the loop measures its sleep again, so a nearer end is kept."""
        if self._woken is not None:
            self._woken.set()

    def _interval(self) -> float:
        return min(reap_interval(self._sessions(), self._default_idle_s()), self._max_interval)

    async def _run(self, scope: anyio.CancelScope) -> None:
        self._woken = anyio.Event()
        with scope:
            due = anyio.current_time() + self._interval()
            while True:
                with anyio.move_on_after(max(0.0, due - anyio.current_time())):
                    await self._woken.wait()
                if self._woken.is_set():
                    # Only ever sooner: wakes as often as set_timeout is called never put a
                    # round off.
                    self._woken = anyio.Event()
                    due = min(due, anyio.current_time() + self._interval())
                    continue
                await self.round()
                due = anyio.current_time() + self._interval()

    async def round(self) -> None:
        """One round, as the loop runs it after its sleep."""
        for session in self._sessions():
            with contextlib.suppress(BackendError):
                await self.reap_one(session)
        await self._egress.round(self._sessions())
        await self._snapshots.sweep_if_due()
        try:
            report = await self._reconcile()
        except BackendError as exc:
            log.warning("reconcile skipped: %s", exc)
        else:
            if report.reaped or report.forgotten:
                log.info("reconciled: %s", report.summary())

    async def reap_one(self, session: Session) -> None:
        """End, pause or leave one session, as its clocks and its policy say."""
        reason = expiry_reason(session)
        idle_reason = reason is not None and reason.startswith("idle")
        if (reason is None or idle_reason) and lifetime_pause_due(session):
            await self._pausing.pause_at_lifetime_end(session)  # its lifetime first
            return
        if (idle_reason or should_pause(session)) and await self._has_running_work(session):
            session.touch()  # a server or a long job at work: not idle, whatever the clock says
            log.info("session %s not idle: it has running processes or listening ports", session.id)
            return
        if reason is not None:
            await self._end_session(session, reason)
        elif should_pause(session):
            await self._pausing.pause_if_idle(session)

    async def _has_running_work(self, session: Session) -> bool:
        if not session.policy.timeouts.idle_counts_processes or session.paused:
            return False
        listed = await session.processes.list()
        return bool(listed.listening) or any(p.state == "running" for p in listed.processes)
