"""envd's ``filesystem.Filesystem`` service: ``Stat``, ``ListDir``, ``MakeDir``, ``Move`` and
``Remove`` over ``_files``; ``WatchDir`` (a stream) and the watcher calls (``CreateWatcher``,
``GetWatcherEvents``, ``RemoveWatcher``) over ``_watching``.

An entry reads as envd's: owner and group ``user`` (the one unprivileged user of the sandbox),
mode and permissions from the file, its modified time, a symlink shown as what it points at with
its absolute target, and its metadata (``user.e2b.*`` extended attributes). A ``WatchDir``
stream starts with its start event, then sends the watch's events as they come (looked for every
``WATCH_POLL_S``) and a keepalive after each ``WATCH_KEEPALIVE_S`` without one; its watch ends
with the stream, however the stream ends."""

from __future__ import annotations

import datetime
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from protobuf.wkt import Timestamp

from orchestrator.http.e2b._context import current_sandbox
from orchestrator.http.e2b._envd import filesystem_pb as pb
from orchestrator.http.e2b._errors import connect_error
from orchestrator.http.e2b._files import Entry, SandboxFiles
from orchestrator.http.e2b._paths import OutsideHomeError, to_e2b, to_sandhold
from orchestrator.http.e2b._tooling import ToolCallError
from orchestrator.http.e2b._watching import Watchers
from orchestrator.session.files.watching import WatchEvents

__all__ = ["FilesystemService", "entry_type_name"]

_TYPES: Final = {
    "file": pb.FileType.FILE,
    "dir": pb.FileType.DIRECTORY,
    "symlink": pb.FileType.SYMLINK,
}
_EVENTS: Final = {
    "create": pb.EventType.CREATE,
    "write": pb.EventType.WRITE,
    "remove": pb.EventType.REMOVE,
    "rename": pb.EventType.RENAME,
    "chmod": pb.EventType.CHMOD,
}
WATCH_POLL_S: Final = 0.05
WATCH_KEEPALIVE_S: Final = 5.0


def entry_type_name(entry: Entry) -> str:
    return "dir" if entry["type"] == "dir" else "file"


def _path(path: str) -> str:
    try:
        return to_sandhold(path)
    except OutsideHomeError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None


def _entry(entry: Entry) -> pb.EntryInfo:
    mode = int(entry.get("mode") or "0", 8)
    seconds = float(entry.get("mtime") or 0.0)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    link = entry.get("link_target")
    return pb.EntryInfo(
        name=entry["name"],
        type=_TYPES.get(entry["type"], pb.FileType.UNSPECIFIED),
        path=to_e2b(entry["path"]),
        size=int(entry.get("size") or 0),
        mode=mode,
        permissions=_permissions(mode, entry["type"]),
        owner="user",
        group="user",
        modified_time=Timestamp.from_datetime(moment),
        symlink_target=to_e2b(link) if isinstance(link, str) and link.startswith("/") else link,
        metadata=dict(entry.get("metadata") or {}),
    )


def _permissions(mode: int, kind: str) -> str:
    letters = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return ("d" if kind == "dir" else "l" if kind == "symlink" else "-") + letters


def _events(found: WatchEvents) -> list[pb.FilesystemEvent]:
    return [
        pb.FilesystemEvent(
            name=event.name,
            type=_EVENTS[event.type],
            entry=_entry(event.entry) if event.entry is not None else None,
        )
        for event in found.events
    ]


class FilesystemService:
    def __init__(self, orchestrator: Any) -> None:
        self._orchestrator = orchestrator
        self._watchers = Watchers(orchestrator)

    def _files(self) -> SandboxFiles:
        return SandboxFiles(self._orchestrator, current_sandbox())

    async def _stat(self, files: SandboxFiles, path: str) -> Entry:
        try:
            found = await files.stat(path)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        if found is None:
            raise ConnectError(Code.NOT_FOUND, f"path not found: {to_e2b(path)}")
        return found

    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any]) -> pb.StatResponse:
        files = self._files()
        return pb.StatResponse(entry=_entry(await self._stat(files, _path(request.path))))

    async def list_dir(
        self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any]
    ) -> pb.ListDirResponse:
        files = self._files()
        path = _path(request.path)
        entry = await self._stat(files, path)
        if entry["type"] != "dir":
            raise ConnectError(Code.INVALID_ARGUMENT, f"not a directory: {to_e2b(path)}")
        try:
            entries = await files.list(path, depth=max(1, request.depth))
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.ListDirResponse(entries=[_entry(e) for e in entries])

    async def make_dir(
        self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any]
    ) -> pb.MakeDirResponse:
        files = self._files()
        path = _path(request.path)
        try:
            if not await files.make_dir(path):
                raise ConnectError(Code.ALREADY_EXISTS, f"already exists: {to_e2b(path)}")
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.MakeDirResponse(entry=_entry(await self._stat(files, path)))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any]) -> pb.MoveResponse:
        files = self._files()
        source, destination = _path(request.source), _path(request.destination)
        try:
            await files.move(source, destination)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.MoveResponse(entry=_entry(await self._stat(files, destination)))

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveResponse:
        files = self._files()
        try:
            await files.remove(_path(request.path))
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.RemoveResponse()

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        sandbox = current_sandbox()
        watcher = await self._add(request.path, request.recursive, request.include_entry)
        try:
            yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))
            quiet_since = time.monotonic()
            while True:
                try:
                    found = await self._watchers.events(sandbox, watcher)
                except ToolCallError as exc:
                    raise connect_error(exc) from None
                for event in _events(found):
                    yield pb.WatchDirResponse(event=Oneof("filesystem", event))
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= WATCH_KEEPALIVE_S:
                    yield pb.WatchDirResponse(
                        event=Oneof("keepalive", pb.WatchDirResponse.KeepAlive())
                    )
                    quiet_since = time.monotonic()
                await anyio.sleep(WATCH_POLL_S)
        finally:
            with anyio.CancelScope(shield=True):
                await self._watchers.remove(sandbox, watcher)

    async def _add(self, path: str, recursive: bool, include_entry: bool) -> Any:
        sandbox = current_sandbox()
        try:
            return await self._watchers.add(
                sandbox, _path(path), recursive=recursive, include_entry=include_entry
            )
        except ToolCallError as exc:
            raise connect_error(exc) from None

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CreateWatcherResponse:
        watcher = await self._add(request.path, request.recursive, request.include_entry)
        return pb.CreateWatcherResponse(watcher_id=watcher.watcher_id)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> pb.GetWatcherEventsResponse:
        sandbox = current_sandbox()
        try:
            watcher = self._watchers.find(sandbox, request.watcher_id)
            found = await self._watchers.events(sandbox, watcher)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.GetWatcherEventsResponse(events=_events(found))

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveWatcherResponse:
        sandbox = current_sandbox()
        try:
            watcher = self._watchers.find(sandbox, request.watcher_id)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        await self._watchers.remove(sandbox, watcher)
        return pb.RemoveWatcherResponse()
