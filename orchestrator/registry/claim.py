"""Registries for orchestrators that run side by side (``sandhold mcp``, ``run``, ``shell``): each
takes a registry file of its own in one directory, ``<orchestrator id>.db``, and proves it is
alive by holding that file's lock (``store._lock``: it dies with the process, ``kill -9``
included). A file whose lock is free belongs to an orchestrator that is gone.

A start claims one registry: with ``adopt`` the newest dead one, whose sessions it then
re-adopts, REPL state included, under that registry's orchestrator id; else (or when none is
dead) a new one. Every other dead registry is handed back as ``Abandoned`` for the caller to reap
(its containers removed, then its files). Locks are only ever tried, never waited for, so several
starts at once each take a different file and never touch a live orchestrator's sessions.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backend.base import LABEL_ORCHESTRATOR, LEGACY_LABEL_ORCHESTRATOR, Backend
from orchestrator.errors import RegistryError
from orchestrator.registry.store import Registry

__all__ = ["Abandoned", "claim", "reap_abandoned", "remove_files", "remove_legacy_containers"]

log = logging.getLogger(__name__)

SUFFIX = ".db"
# What SQLite (WAL) and the lock leave beside a registry file.
COMPANIONS = ("-wal", "-shm", ".lock")


@dataclass(frozen=True)
class Abandoned:
    """A dead orchestrator's registry, opened (so locked) by this process until ``discard``."""

    registry: Registry
    orchestrator_id: str | None

    def discard(self) -> None:
        """Close and delete it; its containers must be gone first."""
        path = self.registry.path
        self.registry.close()
        if path is not None:
            remove_files(path)


def claim(
    directory: Path, *, wanted_id: str | None, adopt: bool
) -> tuple[Registry, list[Abandoned]]:
    """This orchestrator's registry (opened), and the dead ones to reap."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    dead = [found for path in _newest_first(directory) if (found := _take(path)) is not None]
    if wanted_id is not None:
        mine = next((d for d in dead if d.orchestrator_id == wanted_id), None)
        if mine is None:
            return _fresh(directory, wanted_id), dead
        dead.remove(mine)
        return mine.registry, dead
    if adopt and dead:
        return dead[0].registry, dead[1:]
    return _fresh(directory, None), dead


def _newest_first(directory: Path) -> list[Path]:
    paths = []
    for path in directory.glob(f"*{SUFFIX}"):
        with contextlib.suppress(OSError):
            paths.append((path.stat().st_mtime, path))
    return [path for _, path in sorted(paths, reverse=True)]


def _take(path: Path) -> Abandoned | None:
    """The registry at ``path`` if its owner is gone (its lock could be taken), else None."""
    registry = Registry(path)
    try:
        registry.open()
    except RegistryError:
        return None  # alive (locked), or not a registry we can read: not ours to touch
    if not path.exists():  # deleted by its owner's clean shutdown while we took the lock
        registry.close()
        return None
    return Abandoned(registry, registry.stored_orchestrator_id())


def _fresh(directory: Path, wanted_id: str | None) -> Registry:
    orchestrator_id = wanted_id or f"sandhold-{secrets.token_hex(6)}"
    registry = Registry(directory / f"{orchestrator_id}{SUFFIX}")
    registry.open()
    return registry


def remove_files(path: Path) -> None:
    """Delete a registry and its companions, the lock last: a start that takes the lock after
    this finds no registry file and leaves it alone."""
    for name in (path.name, *(path.name + c for c in COMPANIONS)):
        with contextlib.suppress(FileNotFoundError):
            (path.parent / name).unlink()


async def remove_legacy_containers(backend: Backend, orchestrator_id: str) -> list[str]:
    """Remove the containers of ``orchestrator_id`` that carry the pre-rename labels: none of
    them can be re-adopted (their worker lives at the old paths)."""
    removed = []
    for container_id in await backend.list_containers({LEGACY_LABEL_ORCHESTRATOR: orchestrator_id}):
        await backend.remove_container(container_id)
        removed.append(container_id)
    if removed:
        log.info(
            "reaped %d container(s) of %s from before the rename", len(removed), orchestrator_id
        )
    return removed


async def reap_abandoned(backend: Backend, dead: Abandoned) -> list[str]:
    """Remove every container of a dead orchestrator, then its registry; the ids removed."""
    removed: list[str] = []
    if dead.orchestrator_id is not None:
        label = {LABEL_ORCHESTRATOR: dead.orchestrator_id}
        for container_id in await backend.list_containers(label):
            await backend.remove_container(container_id)
            removed.append(container_id)
        removed += await remove_legacy_containers(backend, dead.orchestrator_id)
    dead.discard()
    log.info(
        "reaped %d container(s) of dead orchestrator %s (%s)",
        len(removed),
        dead.orchestrator_id,
        dead.registry.path,
    )
    return removed
