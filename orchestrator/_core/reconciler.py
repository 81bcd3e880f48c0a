"""The reconciler: brings the engine's containers of this orchestrator in line with what it knows.

At start (``adopt=True``) what it knows is the registry: its live sessions are re-adopted
(``adoption``), the rest of its rows forgotten, every other container of the orchestrator's id
reaped. Later (each reaper round) it is the sessions in memory: a container of ours in no table,
no pool and no creation in flight is an orphan and is removed, and a session whose container
stopped or vanished is ended. The decisions are ``reconcile.plan``'s; this module acts on them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from orchestrator._core.adoption import adopt_session
from orchestrator._core.metrics import Metrics
from orchestrator._core.session_table import SessionTable
from orchestrator.backend.base import LABEL_ORCHESTRATOR, LABEL_SESSION, Backend, ContainerSummary
from orchestrator.errors import OrchestratorError
from orchestrator.registry.claim import Abandoned, reap_abandoned, remove_legacy_containers
from orchestrator.registry.reconcile import ReconcileReport, plan
from orchestrator.registry.store import SessionRecord
from orchestrator.session.session import Session

log = logging.getLogger(__name__)

# Re-adopting one session: a sweep exec, a relay exec and a ready frame (or a fresh worker).
ADOPT_TIMEOUT = 30.0
# Sessions re-adopted at once. Each starts a relay (an exec and a Python interpreter) in its
# container: a hundred at once on a small host took 30 s, past the relays' first ready wait, so
# most were interrupted and reached again; a few at a time keep it linear (~0.1 s a session).
ADOPT_CONCURRENCY = 8


class Reconciler:
    def __init__(
        self,
        backend: Backend,
        table: SessionTable,
        *,
        in_flight: Callable[[], set[str]],
        end_session: Callable[[Session, str], Awaitable[None]],
        adopted: Callable[[Session], None],
        metrics: Metrics,
    ) -> None:
        self._backend = backend
        self._table = table
        # Container ids and session ids that exist but belong to no table yet (pools, creations).
        self._in_flight = in_flight
        self._end_session = end_session
        self._adopted = adopted
        self._metrics = metrics

    async def run(
        self,
        orchestrator_id: str,
        *,
        adopt: bool = False,
        task_group: anyio.abc.TaskGroup | None = None,
    ) -> ReconcileReport:
        report = ReconcileReport()
        containers = await self._backend.describe_containers(
            [f"{LABEL_ORCHESTRATOR}={orchestrator_id}"]
        )
        registry = self._table.store
        if adopt:
            records = registry.sessions()
        else:
            records = [_record_of(s) for s in self._table.sessions.values()]
            busy = self._in_flight()
            containers = [
                c
                for c in containers
                if c.id not in busy and c.labels.get(LABEL_SESSION) not in busy
            ]
        by_id = {c.id: c for c in containers}
        decided = plan(records, containers)
        ending = {r.container_id for r in decided.forget} if not adopt else set()
        for container in decided.reap:
            if container.id not in ending:  # ending the session below removes those
                await self._backend.remove_container(container.id)
                report.reaped.append(container.id)
                # At start: left by an earlier run and unknown to the registry (or stopped).
                self._metrics.reaped.labels("unknown_at_start" if adopt else "orphan").inc()
        for record in decided.forget:
            cause = loss_cause(by_id.get(record.container_id))
            if adopt:
                registry.remove_session(record.id)
                self._table.record_lost(record, cause)
            elif (session := self._table.sessions.get(record.id)) is not None:
                await self._end_session(session, cause)
            report.forgotten.append(record.id)
        await self._backend.reap_egress(orchestrator_id, set() if adopt else self._in_flight())
        if adopt:
            if task_group is None:
                raise RuntimeError("re-adopting needs the task group that serves terminals")
            limiter = anyio.CapacityLimiter(ADOPT_CONCURRENCY)
            async with anyio.create_task_group() as tg:
                for record, container in decided.adopt:
                    tg.start_soon(self._adopt, record, container, task_group, report, limiter)
            legacy = await remove_legacy_containers(self._backend, orchestrator_id)
            self._metrics.reaped.labels("legacy_labels").inc(len(legacy))
            report.reaped += legacy
        return report

    async def reap_abandoned(self, abandoned: list[Abandoned]) -> list[str]:
        """Remove every container of the dead orchestrators whose registries this one claimed
        (``registry.claim``), then their registries; the container ids removed."""
        removed: list[str] = []
        for dead in abandoned:
            reaped = await reap_abandoned(self._backend, dead)
            self._metrics.reaped.labels("abandoned_orchestrator").inc(len(reaped))
            removed += reaped
        return removed

    async def _adopt(
        self,
        record: SessionRecord,
        container: ContainerSummary,
        task_group: anyio.abc.TaskGroup,
        report: ReconcileReport,
        limiter: anyio.CapacityLimiter,
    ) -> None:
        registry = self._table.store
        await limiter.acquire()  # the timeout is each session's own: it starts on its turn
        try:
            with anyio.fail_after(ADOPT_TIMEOUT):
                session, items = await adopt_session(
                    self._backend,
                    registry,
                    record,
                    container,
                    task_group=task_group,
                    on_new_worker=lambda pid: registry.set_worker_pid(record.id, pid),
                )
        except (OrchestratorError, TimeoutError) as exc:
            log.warning("session %s could not be re-adopted, reaping it: %s", record.id, exc)
            registry.remove_session(record.id)
            self._table.record_lost(record, f"it could not be re-adopted after a restart: {exc}")
            with contextlib.suppress(OrchestratorError):
                await self._backend.remove_container(container.id)
            report.reaped.append(container.id)
            self._metrics.reaped.labels("readopt_failed").inc()
            return
        finally:
            limiter.release()
        self._adopted(session)
        self._table.adopt(session, items)
        report.adopted.append(record.id)
        self._metrics.readopted.inc()


def loss_cause(container: ContainerSummary | None) -> str:
    """Why a session whose container is not live was lost, as its owner is told."""
    if container is None:
        return (
            "its container stopped or disappeared: the engine no longer has it "
            "(removed from outside sandhold)"
        )
    return (
        f"its container stopped or disappeared: it is {container.state} (the engine was "
        "restarted without live-restore, or it was killed from outside sandhold)"
    )


def _record_of(session: Session) -> SessionRecord:
    """What the periodic round needs of a live session: its id and container."""
    return SessionRecord(
        id=session.id,
        tenant=session.tenant,
        task=session.task,
        policy_json="",
        container_id=session.container_id,
        worker_pid=None,
        created_at="",
    )
