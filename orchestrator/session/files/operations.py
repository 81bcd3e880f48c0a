"""The ``files`` tool on the host side: arguments checked, then a request to the in-container
helper (``worker/fileops.py``), its replies read as ``wire`` says.

Reads, writes, listings, lookups, removes, moves and new directories go to the session's served
helper (``served_helper``), one
long-lived exec started at the first of them: a round trip on its stream, not a ``docker exec``
each (~100 ms). Archives, and a request that finds the served helper busy with another, take a
one-shot run of their own (``helper_exchange``), as every operation once did: an archive moves
up to ``max_file_bytes`` and is worth its own exec (nor does it hold up the small operations
behind it), and an upload's extract is not idempotent, which a served request must be (it is
sent once more when a waiting helper is found gone). Both ways run the same code in the
container and judge the reply by the same rules, so an operation's result and errors do not
depend on the way it took.

Confinement has two halves. Here: every path is confined lexically (``workspace_path``), sizes are
bounded by ``limits.max_file_bytes``, and an uploaded archive is checked member by member
(``archives``), refused whole if any member could land outside /workspace; only checked members
travel on; a downloaded archive is checked by the same rules before it goes out, since the helper's
reply is only as trustworthy as the container. In the container: symlinks, which only the
container can resolve. Archives move through the helper, not the engine's archive API, because
that API neither sees nor writes the tmpfs /workspace of a read-only container.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict

from orchestrator.backend.base import WORKSPACE, Backend
from orchestrator.errors import BackendError, InvalidArgumentError
from orchestrator.policy.arguments import check_flag
from orchestrator.policy.model import Policy
from orchestrator.session.files.archives import (
    TAR_OVERHEAD_BYTES,
    checked_download,
    checked_members,
    inside_workspace,
)
from orchestrator.session.files.watching import Watches
from orchestrator.session.files.wire import (
    FILE_HELPER,
    MAX_LIST_ENTRIES,
    ArchiveReply,
    CheckReply,
    ContentReply,
    EntryReply,
    EntryType,
    ExistsReply,
    ExtractReply,
    ListReply,
    M,
    MakeDirReply,
    RemoveReply,
    RenameReply,
    WriteReply,
    b64_len,
    helper_b64,
)
from orchestrator.session.helper_exchange import call_helper, parse_reply
from orchestrator.session.paths import workspace_path
from orchestrator.session.served_helper import ServedHelper

__all__ = [
    "CheckResult",
    "DownloadResult",
    "EntryType",
    "ExistsResult",
    "FileEntry",
    "ListResult",
    "MakeDirResult",
    "ReadResult",
    "RemoveResult",
    "RenameResult",
    "SessionFiles",
    "StatResult",
    "UploadResult",
    "WriteResult",
]

FILEOPS_ARGV = ("python3", "-I", "/opt/sandhold/worker/fileops.py")
# One docker exec (~60 ms) plus moving at most max_file_bytes over a local socket; a minute
# means the engine or the container is stuck.
OP_TIMEOUT = 60.0
# Room in a reply beyond the base64 of max_file_bytes: JSON framing and a full listing.
REPLY_SLACK_BYTES = 8 * 1024 * 1024
# Room in a served request beyond the base64 of max_file_bytes: the envelope and a path of
# MAX_PATH_CHARS, each character escaped to at most 12 bytes.
REQUEST_SLACK_BYTES = 64 * 1024
# Operations the served helper takes, the small ones. A request is sent twice only when a helper
# that was waiting ended before it answered: one gone idle exits before it reads a request, so
# only a helper killed mid-request by code in the sandbox can have done one (the second answer
# of a remove or a rename is then "no such file"; the others are idempotent).
SERVED_OPS = frozenset(
    {"check", "exists", "list", "make_dir", "read", "remove", "rename", "stat", "write"}
)
# A served helper with no request for this long exits (~6 MiB of the session's memory back);
# an agent's file operations come seconds apart, and after a pause the next pays one exec.
SERVED_IDLE_TIMEOUT = 60.0


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WriteResult(_Result):
    path: str
    size: int
    created: bool


class ReadResult(_Result):
    """``content`` for UTF-8 text without NUL bytes, ``content_b64`` otherwise; never both."""

    path: str
    size: int
    encoding: Literal["utf-8", "base64"]
    content: str | None = None
    content_b64: str | None = None


class FileEntry(_Result):
    name: str
    type: EntryType
    size: int
    mode: str  # permission bits in octal, e.g. "0644"
    mtime: float  # seconds since the epoch
    link_target: str | None = None
    # Its ``user.e2b.*`` extended attributes (E2B's file metadata), when it has any.
    metadata: dict[str, str] | None = None


class ListResult(_Result):
    path: str
    entries: list[FileEntry]
    truncated: bool


class StatResult(FileEntry):
    path: str


class ExistsResult(_Result):
    path: str
    exists: bool
    type: EntryType | None


class RemoveResult(_Result):
    path: str
    type: EntryType


class RenameResult(_Result):
    path: str
    new_path: str
    replaced: bool


class MakeDirResult(_Result):
    path: str
    created: bool


class CheckResult(_Result):
    path: str
    real_path: str
    exists: bool
    type: EntryType | None


class UploadResult(_Result):
    path: str
    entries: int
    size: int


class DownloadResult(_Result):
    path: str
    size: int
    entries: int
    tar_b64: str

    def tar_bytes(self) -> bytes:
        return base64.b64decode(self.tar_b64)


class SessionFiles:
    """The files of one session container, all under /workspace."""

    def __init__(self, backend: Backend, container_id: str, policy: Policy) -> None:
        self._backend = backend
        self._container_id = container_id
        self._limit = policy.limits.max_file_bytes
        self._max_reply = b64_len(self._limit + TAR_OVERHEAD_BYTES) + REPLY_SLACK_BYTES
        self._max_request = b64_len(self._limit) + REQUEST_SLACK_BYTES
        self._served = ServedHelper(
            backend,
            container_id,
            FILE_HELPER,
            max_request_bytes=self._max_request,
            max_reply_bytes=self._max_reply,
        )
        # Directory watches (E2B's watch_dir): a helper of their own, started at the first.
        self.watches = Watches(backend, container_id)

    async def aclose(self) -> None:
        """End the served helpers (their streams close, they exit); idempotent."""
        await self._served.aclose()
        await self.watches.aclose()

    async def write(
        self,
        path: Any,
        *,
        content: Any = None,
        content_b64: Any = None,
        make_parents: Any = True,
    ) -> WriteResult:
        target = workspace_path(path)
        if target == WORKSPACE:
            raise InvalidArgumentError(f"path names {WORKSPACE} itself, not a file in it")
        data = _content(content, content_b64, self._limit)
        parents = check_flag(make_parents, "make_parents")
        request = {"path": target, "content_b64": _b64(data), "make_parents": parents}
        reply = await self._call("write", request, WriteReply)
        if reply.size != len(data):
            raise BackendError(f"the file helper wrote {reply.size} of {len(data)} bytes")
        return WriteResult(path=target, size=len(data), created=reply.created)

    async def read(self, path: Any) -> ReadResult:
        target = workspace_path(path)
        request = {"path": target, "max_bytes": self._limit}
        reply = await self._call("read", request, ContentReply)
        data = helper_b64(reply.content_b64, self._limit)
        if b"\0" not in data:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                return ReadResult(path=target, size=len(data), encoding="utf-8", content=text)
        b64 = _b64(data)
        return ReadResult(path=target, size=len(data), encoding="base64", content_b64=b64)

    async def list(self, path: Any = ".") -> ListResult:
        target = workspace_path(path)
        request = {"path": target, "max_entries": MAX_LIST_ENTRIES}
        reply = await self._call("list", request, ListReply)
        entries = [FileEntry(**entry.entry()) for entry in reply.entries]
        return ListResult(path=target, entries=entries, truncated=reply.truncated)

    async def stat(self, path: Any) -> StatResult:
        """The entry at ``path``; a final symlink is described, not followed (as ``list``)."""
        target = workspace_path(path)
        reply = await self._call("stat", {"path": target}, EntryReply)
        return StatResult(path=target, **reply.entry())

    async def exists(self, path: Any) -> ExistsResult:
        """Whether an entry is at ``path`` (a final symlink counts, not followed), and what it
        is; a path outside /workspace, or through a link leading out, is refused, not False."""
        target = workspace_path(path)
        reply = await self._call("exists", {"path": target}, ExistsReply)
        if reply.exists != (reply.type is not None):
            raise BackendError("the file helper said an entry exists without a type, or both")
        return ExistsResult(path=target, exists=reply.exists, type=reply.type)

    async def remove(self, path: Any, *, recursive: Any = False) -> RemoveResult:
        """Remove a file, a link (not its target) or an empty directory; a directory with
        what is in it only with ``recursive``."""
        target = workspace_path(path)
        if target == WORKSPACE:
            raise InvalidArgumentError(f"path names {WORKSPACE} itself, which is never removed")
        request = {"path": target, "recursive": check_flag(recursive, "recursive")}
        reply = await self._call("remove", request, RemoveReply)
        return RemoveResult(path=target, type=reply.type)

    async def rename(self, path: Any, new_path: Any, *, overwrite: Any = False) -> RenameResult:
        """Move ``path`` to ``new_path``, replacing an entry there only with ``overwrite``."""
        source = workspace_path(path)
        dest = workspace_path(new_path, name="new_path")
        if WORKSPACE in (source, dest):
            raise InvalidArgumentError(f"{WORKSPACE} itself is never moved nor replaced")
        if source == dest:
            raise InvalidArgumentError("path and new_path name the same entry")
        if dest.startswith(source + "/"):
            raise InvalidArgumentError(
                "new_path is inside path: a directory cannot move into itself"
            )
        flag = check_flag(overwrite, "overwrite")
        request = {"path": source, "new_path": dest, "overwrite": flag}
        reply = await self._call("rename", request, RenameReply)
        if reply.replaced and not flag:
            raise BackendError("the file helper replaced an entry without overwrite")
        return RenameResult(path=source, new_path=dest, replaced=reply.replaced)

    async def make_dir(self, path: Any, *, parents: Any = True) -> MakeDirResult:
        """A directory at ``path`` (missing parents made too, unless ``parents`` is False);
        ``created`` False when one was there already."""
        target = workspace_path(path)
        request = {"path": target, "parents": check_flag(parents, "parents")}
        reply = await self._call("make_dir", request, MakeDirReply)
        return MakeDirResult(path=target, created=reply.created)

    async def check(self, path: Any) -> CheckResult:
        """Where ``path`` really is, following symlinks, refused if that is outside /workspace;
        e.g. for a caller-given working directory."""
        target = workspace_path(path)
        reply = await self._call("check", {"path": target}, CheckReply)
        real = reply.real_path
        if not inside_workspace(real) or posixpath.normpath(real) != real:
            raise BackendError("the file helper resolved a path outside the workspace")
        return CheckResult(path=target, **reply.model_dump())

    async def upload(
        self, path: Any, *, tar_b64: Any = None, tar_bytes: Any = None
    ) -> UploadResult:
        """Extract a tar archive (plain or compressed) into the directory ``path``."""
        dest = workspace_path(path)
        archive = _archive_argument(tar_b64, tar_bytes, self._limit + TAR_OVERHEAD_BYTES)
        members = await anyio.to_thread.run_sync(checked_members, archive, dest, self._limit)
        request = {"path": dest, "members": members}
        reply = await self._call("extract", request, ExtractReply)
        return UploadResult(path=dest, entries=reply.entries, size=reply.size)

    async def download(self, path: Any) -> DownloadResult:
        """A tar of the file or directory ``path``, members named from its basename; the
        helper's archive is checked here and rewritten before it goes out (``archives``)."""
        target = workspace_path(path)
        limit = self._limit + TAR_OVERHEAD_BYTES
        reply = await self._call("archive", {"path": target, "max_bytes": limit}, ArchiveReply)
        data = helper_b64(reply.archive_b64, limit)
        parent = posixpath.dirname(target)
        tar, entries = await anyio.to_thread.run_sync(checked_download, data, parent)
        return DownloadResult(path=target, size=len(tar), entries=entries, tar_b64=_b64(tar))

    async def _call(self, op: str, request: dict[str, Any], model: type[M]) -> M:
        if op in SERVED_OPS:
            argv = [*FILEOPS_ARGV, "--serve", str(self._max_request), f"{SERVED_IDLE_TIMEOUT:g}"]
            reply = await self._served.call(argv, op, request, model, timeout=OP_TIMEOUT)
            if reply is not None:
                return reply
        data = await call_helper(
            self._backend,
            self._container_id,
            FILE_HELPER,
            [*FILEOPS_ARGV, op],
            request,
            max_reply_bytes=self._max_reply,
            timeout=OP_TIMEOUT,
        )
        return parse_reply(FILE_HELPER, op, model, data)


def _content(content: Any, content_b64: Any, limit: int) -> bytes:
    if (content is None) == (content_b64 is None):
        raise InvalidArgumentError("give exactly one of content and content_b64")
    if content is not None:
        if not isinstance(content, str):
            raise InvalidArgumentError("content must be a string")
        if len(content) > limit:  # every character is at least one byte
            raise InvalidArgumentError(f"content is more than the limit of {limit} bytes")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError("content is not encodable as UTF-8") from None
    else:
        data = _caller_b64(content_b64, "content_b64", limit)
    if len(data) > limit:
        raise InvalidArgumentError(f"content is {len(data)} bytes, more than the limit of {limit}")
    return data


def _caller_b64(value: Any, name: str, limit: int) -> bytes:
    """Standard base64; line breaks and spaces (as ``base64`` wraps its output) are allowed."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a base64 string")
    if len(value) > 2 * b64_len(limit):
        raise InvalidArgumentError(f"{name} is more than the limit of {limit} bytes")
    try:
        data = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(f"{name} is not valid base64") from None
    if len(data) > limit:
        raise InvalidArgumentError(f"{name} is {len(data)} bytes, more than the limit of {limit}")
    return data


def _archive_argument(tar_b64: Any, tar_bytes: Any, limit: int) -> bytes:
    if (tar_b64 is None) == (tar_bytes is None):
        raise InvalidArgumentError("give exactly one of tar_b64 and tar_bytes")
    if tar_b64 is not None:
        return _caller_b64(tar_b64, "tar_b64", limit)
    if not isinstance(tar_bytes, bytes | bytearray):
        raise InvalidArgumentError("tar_bytes must be bytes")
    if len(tar_bytes) > limit:
        raise InvalidArgumentError(f"the archive is more than the limit of {limit} bytes")
    return bytes(tar_bytes)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
