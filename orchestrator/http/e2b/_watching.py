"""E2B's directory watchers (``files.watch_dir``) over the session's watches
(``session/files/watching``: inotify in the sandbox, through a helper of its own).

A watcher is the session's watch plus what E2B names it by: a random id, the sandbox it belongs
to (another sandbox's id is ``not found``, as an unknown one is) and its directory. The table is
bounded per sandbox (``MAX_WATCHERS``) and in all (``MAX_KEPT``, oldest forgotten first); a
watcher whose session watch ended (the sandbox was killed, its watcher process lost) is dropped
the first time it is asked for. Watches belong to
the session, which already has its own tool-layer checks behind it (the data plane reached this
sandbox with its token): this module reaches the session the way the tool layer does, by id and
tenant through ``Orchestrator.session``, and asks nothing of it but its watches."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Final

from orchestrator.errors import OrchestratorError
from orchestrator.http.e2b._sandboxes import E2bSandbox
from orchestrator.http.e2b._tooling import ToolCallError
from orchestrator.session.files.watching import Watches, WatchEvents

__all__ = ["MAX_WATCHERS", "Watcher", "Watchers"]

MAX_WATCHERS: Final = 32
# Watchers kept across all sandboxes: past it the oldest is forgotten (its events then read as
# not found). Watchers of a sandbox killed without stopping them are never asked for again;
# this bounds what they keep.
MAX_KEPT: Final = 4096


@dataclasses.dataclass(frozen=True)
class Watcher:
    watcher_id: str
    sandbox_id: str
    watch_id: str
    path: str  # sandhold's path of the watched directory


class Watchers:
    def __init__(self, orchestrator: Any) -> None:
        self._orchestrator = orchestrator
        self._by_id: dict[str, Watcher] = {}

    async def _watches(self, sandbox: E2bSandbox) -> Watches:
        try:
            session = await self._orchestrator.session(sandbox.session_id, tenant=sandbox.tenant)
        except OrchestratorError as exc:
            raise ToolCallError(exc.error_type, str(exc)) from None
        watches: Watches = session.files.watches
        return watches

    async def add(
        self, sandbox: E2bSandbox, path: str, *, recursive: bool, include_entry: bool
    ) -> Watcher:
        if sum(w.sandbox_id == sandbox.sandbox_id for w in self._by_id.values()) >= MAX_WATCHERS:
            raise ToolCallError("quota_exceeded", f"at most {MAX_WATCHERS} watchers per sandbox")
        watches = await self._watches(sandbox)
        try:
            watch_id = await watches.add(path, recursive=recursive, include_entry=include_entry)
        except OrchestratorError as exc:
            raise ToolCallError(exc.error_type, str(exc)) from None
        watcher = Watcher(secrets.token_hex(8), sandbox.sandbox_id, watch_id, path)
        while len(self._by_id) >= MAX_KEPT:
            del self._by_id[next(iter(self._by_id))]
        self._by_id[watcher.watcher_id] = watcher
        return watcher

    def find(self, sandbox: E2bSandbox, watcher_id: str) -> Watcher:
        found = self._by_id.get(watcher_id)
        if found is None or found.sandbox_id != sandbox.sandbox_id:
            raise ToolCallError("path_not_found", f"watcher {watcher_id[:64]!r} not found")
        return found

    async def events(self, sandbox: E2bSandbox, watcher: Watcher) -> WatchEvents:
        watches = await self._watches(sandbox)
        try:
            return await watches.events(watcher.watch_id)
        except OrchestratorError as exc:
            if exc.error_type == "path_not_found":
                self._by_id.pop(watcher.watcher_id, None)
            raise ToolCallError(exc.error_type, str(exc)) from None

    async def remove(self, sandbox: E2bSandbox, watcher: Watcher) -> None:
        self._by_id.pop(watcher.watcher_id, None)
        try:
            watches = await self._watches(sandbox)
            await watches.remove(watcher.watch_id)
        except (OrchestratorError, ToolCallError):
            return  # its session or its watcher process is gone, and the watch with it
