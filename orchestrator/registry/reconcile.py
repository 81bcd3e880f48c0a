"""Matching the registry with the containers the engine has, on start and periodically.

Pure planning: a container labelled with this orchestrator's id is re-adopted when the registry
knows its session and it still runs (or is paused); it is reaped when the registry does not know
it, or knows it but it is stopped. A registry row whose container is gone is forgotten. Containers
of other orchestrator ids never reach this module: the caller lists by label.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator.backend.base import LABEL_SESSION, ContainerSummary
from orchestrator.registry.store import SessionRecord

__all__ = ["ReconcileReport", "plan"]

LIVE_STATES = frozenset({"running", "paused"})


@dataclass(frozen=True)
class ReconcilePlan:
    adopt: list[tuple[SessionRecord, ContainerSummary]]
    reap: list[ContainerSummary]
    forget: list[SessionRecord]


def plan(records: Iterable[SessionRecord], containers: Iterable[ContainerSummary]) -> ReconcilePlan:
    by_id = {c.id: c for c in containers}
    adopt: list[tuple[SessionRecord, ContainerSummary]] = []
    reap: list[ContainerSummary] = []
    forget: list[SessionRecord] = []
    for record in records:
        container = by_id.pop(record.container_id, None)
        if container is None:
            forget.append(record)
        elif container.state in LIVE_STATES and container.labels.get(LABEL_SESSION) == record.id:
            adopt.append((record, container))
        else:
            forget.append(record)
            reap.append(container)
    reap.extend(by_id.values())
    return ReconcilePlan(adopt=adopt, reap=reap, forget=forget)


@dataclass
class ReconcileReport:
    """What a reconcile did, for the log and for ``sandhold serve``'s start-up message."""

    adopted: list[str] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"re-adopted {len(self.adopted)} session(s), reaped {len(self.reaped)} container(s), "
            f"forgot {len(self.forgotten)} session(s) whose container was gone"
        )
