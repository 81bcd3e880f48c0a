"""What sandhold runs on this engine, seen from the engine: every container labelled by sandhold,
whoever started it. For ops: it needs no running orchestrator, so it also shows what a crashed one
left behind. It never touches a container without the sandhold labels.

Labels are fixed when a container is made, so a session handed out from a warm pool is labelled
with the pool's tenant; a registry, when given, names the real owner (tenant and task)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import anyio

from orchestrator.backend.base import (
    LABEL_ORCHESTRATOR,
    LABEL_POLICY_NAME,
    LABEL_SESSION,
    LABEL_TENANT,
    Backend,
    ContainerSummary,
)
from orchestrator.errors import BackendError, SessionNotFoundError

__all__ = ["FleetEntry", "kill_session", "list_fleet"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class FleetEntry:
    session_id: str
    tenant: str
    task: str | None
    policy: str
    orchestrator_id: str
    state: str
    age_s: float
    memory_mb: float | None
    container_id: str

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


async def list_fleet(
    backend: Backend,
    *,
    with_memory: bool = True,
    owners: Mapping[str, tuple[str, str | None]] | None = None,
) -> list[FleetEntry]:
    """Every sandhold container; ``owners`` (session id -> tenant, task, from ``store.read_owners``)
    wins over the labels."""
    owners = owners or {}
    containers = await backend.describe_containers([LABEL_SESSION, LABEL_ORCHESTRATOR])
    memory: dict[str, float | None] = {c.id: None for c in containers}

    async def measure(container_id: str) -> None:
        try:
            stats = await backend.stats(container_id)
        except BackendError:
            return  # removed (or stopping) since it was listed: no figure, not a failure
        memory[container_id] = round(stats["memory_bytes"] / MIB, 1)

    if with_memory:
        async with anyio.create_task_group() as tg:
            for container in containers:
                if container.state == "running":
                    tg.start_soon(measure, container.id)
    now = time.time()
    entries = [_entry(c, memory[c.id], owners, now) for c in containers]
    return sorted(entries, key=lambda e: e.age_s)


def _entry(
    container: ContainerSummary,
    memory_mb: float | None,
    owners: Mapping[str, tuple[str, str | None]],
    now: float,
) -> FleetEntry:
    session_id = container.labels.get(LABEL_SESSION, "")
    tenant, task = owners.get(session_id, (container.labels.get(LABEL_TENANT, ""), None))
    return FleetEntry(
        session_id=session_id,
        tenant=tenant,
        task=task,
        policy=container.labels.get(LABEL_POLICY_NAME, ""),
        orchestrator_id=container.labels.get(LABEL_ORCHESTRATOR, ""),
        state=container.state,
        age_s=round(max(now - container.created, 0.0), 1),
        memory_mb=memory_mb,
        container_id=container.id[:12],
    )


async def kill_session(backend: Backend, session_id: str) -> int:
    """Remove the container(s) of one sandhold session; how many were removed."""
    if not session_id or "=" in session_id or "," in session_id:
        raise SessionNotFoundError(f"session not found: {session_id}")
    found = await backend.describe_containers([f"{LABEL_SESSION}={session_id}", LABEL_ORCHESTRATOR])
    if not found:
        raise SessionNotFoundError(f"session not found: {session_id}")
    for container in found:
        await backend.remove_container(container.id)
    return len(found)
