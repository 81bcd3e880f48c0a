"""What the operations page is told about live sessions: owner, policy, age, state, and CPU and
memory as the engine measures them.

Why the figures are sampled in the background, and only while someone looks: a one-shot stats
request takes about a second on Docker 20.10 (the engine answers at its collector's next tick)
and holds one of the engine client's threads, which the sessions' own calls need. So one task
samples, at most ``STATS_CONCURRENCY`` requests at a time, while the overview was asked for
within ``WATCH_TIMEOUT``; a request for the overview never waits for the engine: it gets the
latest figures, None before a session's first sample.

CPU is a rate: the CPU time a container used between two samples over the wall time between
them, in percent of one CPU (200 is two CPUs busy); a session's first sample gives memory only.

Invariants: nothing here touches a session (an open page must not keep sessions from their idle
teardown) or changes one; samples of ended sessions are dropped at each sweep's end, so at most
the sessions alive at the last sweep have one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import anyio.abc

from orchestrator.backend.base import Backend
from orchestrator.errors import BackendError
from orchestrator.session.session import Session

__all__ = [
    "SAMPLE_INTERVAL",
    "STATS_CONCURRENCY",
    "WATCH_TIMEOUT",
    "SessionUsage",
    "UsageSampler",
    "session_row",
    "session_state",
]

# Engine client threads the sampler may hold at once: a quarter of the client's 16, so the
# sessions' own calls keep the rest.
STATS_CONCURRENCY: Final = 4
# A sweep starts at most this often; a sweep of many sessions takes longer (about a second per
# STATS_CONCURRENCY sessions), and the next one starts when it ends.
SAMPLE_INTERVAL: Final = 2.0
# Sampling stops this long after the overview was last asked for (the page asks every 2 s).
WATCH_TIMEOUT: Final = 30.0
MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class SessionUsage:
    """One session's latest figures."""

    cpu_percent: float | None
    memory_mb: float
    memory_limit_mb: float
    sampled_at: datetime


@dataclass(frozen=True)
class _Sample:
    cpu_seconds: float
    at: float  # the sampler's clock
    usage: SessionUsage


Containers = Callable[[], Mapping[str, str]]


class UsageSampler:
    """Samples the engine's stats of live sessions while ``watch`` is called.

    ``containers()`` names the live sessions' containers (session id -> container id)."""

    def __init__(
        self,
        backend: Backend,
        containers: Containers,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = SAMPLE_INTERVAL,
    ) -> None:
        self._backend = backend
        self._containers = containers
        self._clock = clock
        self._interval = interval
        self._samples: dict[str, _Sample] = {}
        self._asked = -WATCH_TIMEOUT
        self._running = False

    def usage(self, session_id: str) -> SessionUsage | None:
        sample = self._samples.get(session_id)
        return None if sample is None else sample.usage

    def watch(self, task_group: anyio.abc.TaskGroup) -> None:
        """Someone looks: keep sampling (in ``task_group``) for another ``WATCH_TIMEOUT``."""
        self._asked = self._clock()
        if not self._running:
            self._running = True
            task_group.start_soon(self._run)

    async def _run(self) -> None:
        try:
            while self._clock() - self._asked < WATCH_TIMEOUT:
                started = self._clock()
                await self.sweep()
                await anyio.sleep(max(0.0, self._interval - (self._clock() - started)))
        finally:
            self._running = False

    async def sweep(self) -> None:
        """Sample every live session once (``STATS_CONCURRENCY`` at a time)."""
        limiter = anyio.CapacityLimiter(STATS_CONCURRENCY)
        async with anyio.create_task_group() as group:
            for session_id, container_id in self._containers().items():
                group.start_soon(self._sample, limiter, session_id, container_id)
        live = self._containers()
        for gone in self._samples.keys() - live.keys():
            del self._samples[gone]

    async def _sample(
        self, limiter: anyio.CapacityLimiter, session_id: str, container_id: str
    ) -> None:
        # Bounded by the engine client's own API timeout: its threads cannot be cancelled.
        async with limiter:
            try:
                stats = await self._backend.stats(container_id)
            except BackendError:
                return  # ended (or stopping) since it was listed: no figure, not a failure
        at = self._clock()
        cpu_seconds = stats.get("cpu_seconds", 0.0)
        before = self._samples.get(session_id)
        cpu_percent = None
        if before is not None and at > before.at and cpu_seconds >= before.cpu_seconds:
            cpu_percent = round((cpu_seconds - before.cpu_seconds) / (at - before.at) * 100, 1)
        usage = SessionUsage(
            cpu_percent=cpu_percent,
            memory_mb=round(stats.get("memory_bytes", 0.0) / MIB, 1),
            memory_limit_mb=round(stats.get("memory_limit_bytes", 0.0) / MIB, 1),
            sampled_at=datetime.now(UTC),
        )
        self._samples[session_id] = _Sample(cpu_seconds, at, usage)


def session_state(session: Session) -> str:
    return "paused" if session.paused else "busy" if session.busy else "idle"


def listing_row(session: Session) -> dict[str, Any]:
    """One session as ``list_sessions`` answers it to its owner (no engine figures)."""
    return {
        "session_id": session.id,
        "policy": session.policy.name,
        "task": session.task,
        "created_at": session.created_at.isoformat(),
        "idle_seconds": round(session.idle_seconds, 3),
        "commands_count": session.history.count,
        "metadata": dict(session.metadata),
    }


def session_row(session: Session, usage: SessionUsage | None, now: datetime) -> dict[str, Any]:
    """One session as the overview shows it (``usage`` None: not sampled yet)."""
    return {
        "session_id": session.id,
        "tenant": session.tenant,
        "task": session.task,
        "policy": session.policy.name,
        "state": session_state(session),
        "created_at": session.created_at.isoformat(),
        "age_s": round(max((now - session.created_at).total_seconds(), 0.0), 1),
        "idle_s": round(session.idle_seconds, 1),
        "cpu_percent": None if usage is None else usage.cpu_percent,
        "memory_mb": None if usage is None else usage.memory_mb,
        "memory_limit_mb": None if usage is None else usage.memory_limit_mb,
        "sampled_at": None if usage is None else usage.sampled_at.isoformat(),
    }
