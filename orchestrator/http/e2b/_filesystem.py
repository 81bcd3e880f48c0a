"""envd's ``filesystem.Filesystem`` service: ``Stat``, ``ListDir``, ``MakeDir``, ``Move`` and
``Remove`` over ``_files``. Watching a directory is not supported and says so (UNIMPLEMENTED)
at once, never leaving a client waiting for events that will not come."""

from __future__ import annotations

import datetime
from typing import Any, Final

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf.wkt import Timestamp

from orchestrator.http.e2b._context import current_sandbox
from orchestrator.http.e2b._envd import filesystem_pb as pb
from orchestrator.http.e2b._errors import connect_error
from orchestrator.http.e2b._files import Entry, SandboxFiles
from orchestrator.http.e2b._paths import OutsideHomeError, to_e2b, to_sandhold
from orchestrator.http.e2b._tooling import ToolCallError

__all__ = ["FilesystemService", "entry_type_name"]

_TYPES: Final = {
    "file": pb.FileType.FILE,
    "dir": pb.FileType.DIRECTORY,
    "symlink": pb.FileType.SYMLINK,
}
_WATCH: Final = "watching a directory is not supported by sandhold"


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
        symlink_target=entry.get("link_target"),
        is_symlink=entry["type"] == "symlink",
    )


def _permissions(mode: int, kind: str) -> str:
    letters = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return ("d" if kind == "dir" else "l" if kind == "symlink" else "-") + letters


class FilesystemService:
    def __init__(self, orchestrator: Any) -> None:
        self._orchestrator = orchestrator

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
            if await files.stat(path) is not None:
                raise ConnectError(Code.ALREADY_EXISTS, f"already exists: {to_e2b(path)}")
            await files.make_dir(path)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.MakeDirResponse(entry=_entry(await self._stat(files, path)))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any]) -> pb.MoveResponse:
        files = self._files()
        source, destination = _path(request.source), _path(request.destination)
        await self._stat(files, source)
        try:
            await files.move(source, destination)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.MoveResponse(entry=_entry(await self._stat(files, destination)))

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveResponse:
        files = self._files()
        path = _path(request.path)
        await self._stat(files, path)
        try:
            await files.remove(path)
        except ToolCallError as exc:
            raise connect_error(exc) from None
        return pb.RemoveResponse()

    async def watch_dir(self, request: Any, ctx: RequestContext[Any, Any]) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, _WATCH)
        yield  # type: ignore[unreachable]  # a server stream: the error is its only answer

    async def create_watcher(self, request: Any, ctx: RequestContext[Any, Any]) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, _WATCH)

    async def get_watcher_events(self, request: Any, ctx: RequestContext[Any, Any]) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, _WATCH)

    async def remove_watcher(self, request: Any, ctx: RequestContext[Any, Any]) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, _WATCH)
