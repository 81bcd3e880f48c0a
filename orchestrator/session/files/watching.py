"""Watches of a session's directories, host side: requests to the in-container watcher
(``worker/watcher.py``), one long-lived exec served as the file helper is (``served_helper``),
started at the first watch, its replies judged as untrusted.

Invariants: a watch lives in the watcher process; when that process ends (the session ends,
code in the sandbox kills it, it is dropped for a bad line) its watches end with it, and asking
for their events is ``path_not_found`` (the watch is gone), never a wait. The watcher exits on
its own only when no watch is kept and nothing was asked for ``IDLE_TIMEOUT``. One request at a
time: a caller that finds the watcher busy waits its turn, bounded by ``OP_TIMEOUT``. Every
path an event names is checked to lie under /workspace before it goes out.
"""

from __future__ import annotations

import posixpath
from typing import Any, Final, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backend.base import WORKSPACE, Backend
from orchestrator.errors import BackendError
from orchestrator.session.files.archives import inside_workspace
from orchestrator.session.files.wire import EntryReply, FileReply
from orchestrator.session.helper_exchange import Helper
from orchestrator.session.paths import MAX_PATH_CHARS, workspace_path
from orchestrator.session.served_helper import ServedHelper

__all__ = ["WATCHER", "WatchEvent", "WatchEvents", "Watches"]

WATCHER: Final = Helper("file watcher")
WATCHER_ARGV: Final = ("python3", "-I", "/opt/sandhold/worker/watcher.py")
# A request is a path and a few flags; a reply at most the watcher's MAX_REPLY_EVENTS events,
# each a path and an entry.
MAX_REQUEST_BYTES: Final = 64 * 1024
MAX_REPLY_BYTES: Final = 8 * 1024 * 1024
MAX_REPLY_EVENTS: Final = 2000
OP_TIMEOUT: Final = 30.0
IDLE_TIMEOUT: Final = 60.0
# How often a caller that found the watcher busy looks again.
BUSY_RETRY_S: Final = 0.002

EventType = Literal["create", "write", "remove", "rename", "chmod"]


class _AddReply(FileReply):
    watch_id: str = Field(min_length=1, max_length=64)


class _EventEntry(EntryReply):
    path: str = Field(max_length=MAX_PATH_CHARS)


class _Event(FileReply):
    name: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    type: EventType
    entry: _EventEntry | None = None


class _EventsReply(FileReply):
    events: list[_Event] = Field(max_length=MAX_REPLY_EVENTS)
    overflowed: bool


class _Done(FileReply):
    pass


class WatchEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # relative to the watched directory
    type: EventType
    # The entry as ``list`` shows it, with its ``path``, when asked for and still there.
    entry: dict[str, Any] | None = None


class WatchEvents(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    events: list[WatchEvent]
    # Events were dropped (the kernel's queue, or the watcher's own bound, ran over).
    overflowed: bool


class Watches:
    """The watches of one session container, all under /workspace."""

    def __init__(self, backend: Backend, container_id: str) -> None:
        self._served = ServedHelper(
            backend,
            container_id,
            WATCHER,
            max_request_bytes=MAX_REQUEST_BYTES,
            max_reply_bytes=MAX_REPLY_BYTES,
        )

    async def aclose(self) -> None:
        """End the watcher (its stream closes, it exits) and every watch with it."""
        await self._served.aclose()

    async def add(self, path: Any, *, recursive: bool, include_entry: bool) -> str:
        """A watch of the directory ``path``; its id."""
        target = workspace_path(path)
        request = {"path": target, "recursive": recursive, "include_entry": include_entry}
        reply = await self._call("add", request, _AddReply)
        return str(reply.watch_id)

    async def events(self, watch_id: str) -> WatchEvents:
        """What happened in the watch since the last call; ``path_not_found`` once it ended."""
        reply = await self._call("events", {"watch_id": watch_id}, _EventsReply)
        events = []
        for event in reply.events:
            name = posixpath.normpath(event.name)
            if name.startswith(("/", "../")) or name == "..":
                raise BackendError("the file watcher named a path outside its directory")
            entry = None
            if event.entry is not None:
                if not inside_workspace(event.entry.path) and event.entry.path != WORKSPACE:
                    raise BackendError("the file watcher named a path outside the workspace")
                entry = {**event.entry.entry(), "path": event.entry.path}
            events.append(WatchEvent(name=name, type=event.type, entry=entry))
        return WatchEvents(events=events, overflowed=reply.overflowed)

    async def remove(self, watch_id: str) -> None:
        await self._call("remove", {"watch_id": watch_id}, _Done)

    async def _call(self, op: str, request: dict[str, Any], model: type[Any]) -> Any:
        argv = [*WATCHER_ARGV, str(MAX_REQUEST_BYTES), f"{IDLE_TIMEOUT:g}"]
        with anyio.move_on_after(OP_TIMEOUT):
            while True:
                reply = await self._served.call(argv, op, request, model, timeout=OP_TIMEOUT)
                if reply is not None:
                    return reply
                await anyio.sleep(BUSY_RETRY_S)  # busy with another caller's request
        raise BackendError(f"the file watcher was busy for {OP_TIMEOUT:g} s")
