"""Opening the registry an orchestrator keeps its sessions in: the one file (or memory), or one
claimed in a shared ``registry_dir`` (``registry.claim``), and closing it last.

Invariants: whatever is opened here is closed by the exit stack it was given, on every path (a
start that fails after the claim included); a claimed registry that keeps no session is deleted
with its lock when it is closed, so the directory holds only live orchestrators and those that
left sessions to re-adopt or reap.
"""

from __future__ import annotations

import contextlib

from orchestrator._core.config import OrchestratorConfig
from orchestrator.registry.claim import Abandoned, claim, remove_files
from orchestrator.registry.store import Registry

__all__ = ["open_registry"]


def open_registry(
    registry: Registry, config: OrchestratorConfig, exit_stack: contextlib.AsyncExitStack
) -> tuple[Registry, list[Abandoned]]:
    """``registry`` opened (without a ``config.registry_dir``), else one claimed in that
    directory; and the dead orchestrators' registries to reap (closed by ``exit_stack`` if the
    caller fails first)."""
    directory = config.registry_dir
    if directory is None:
        registry.open()
        exit_stack.callback(registry.close)
        return registry, []
    claimed, abandoned = claim(directory, wanted_id=config.orchestrator_id, adopt=config.adopt_dead)
    exit_stack.callback(_release_claimed, claimed)
    for dead in abandoned:
        exit_stack.callback(dead.registry.close)
    return claimed, abandoned


def _release_claimed(registry: Registry) -> None:
    path, keeps = registry.path, bool(registry.sessions())
    registry.close()
    if path is not None and not keeps:
        remove_files(path)
