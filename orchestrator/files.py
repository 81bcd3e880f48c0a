"""The ``files`` tool on the host side: arguments checked, then one run of the in-container helper
(``worker/fileops.py``) per operation.

Confinement has two halves. Here: every path is confined lexically (``workspace_path``), sizes are
bounded by ``limits.max_file_bytes``, and an uploaded archive is read member by member and refused
whole if any member is absolute, climbs with ``..``, is a device, FIFO or hard link, or is a
symlink that leads out of /workspace; only checked members travel on. In the container: symlinks,
which only the container can resolve. Archives move through the helper, not the engine's archive
API, because that API neither sees nor writes the tmpfs /workspace of a read-only container.

Everything the helper says is untrusted: its reply is size-bounded, strictly decoded and checked
against the models below; anything else is a ``BackendError``, never a crash.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import io
import json
import lzma
import posixpath
import tarfile
import zlib
from typing import Any, Literal, NoReturn, TypeVar

import anyio
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backend.base import STDERR, WORKSPACE, ExecSpec, ExecStream
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import (
    BackendError,
    ExecutionTimeoutError,
    InvalidArgumentError,
    OrchestratorError,
    QuotaExceededError,
)
from orchestrator.paths import MAX_PATH_CHARS, workspace_path
from orchestrator.policy import Policy

FILEOPS_ARGV = ("python3", "-I", "/opt/sbx/worker/fileops.py")
# One docker exec (~60 ms) plus moving at most max_file_bytes over a local socket; a minute
# means the engine or the container is stuck.
OP_TIMEOUT = 60.0
# Room in a reply beyond the base64 of max_file_bytes: JSON framing and a full listing.
REPLY_SLACK_BYTES = 8 * 1024 * 1024
# Headers and padding of a tar holding max_file_bytes of content.
TAR_OVERHEAD_BYTES = 1024 * 1024
MAX_LIST_ENTRIES = 2000
MAX_ARCHIVE_MEMBERS = 10_000
MAX_MESSAGE_CHARS = 4096
STDERR_TAIL_BYTES = 2048
SEND_CHUNK_BYTES = 256 * 1024

EntryType = Literal["file", "dir", "symlink", "other"]
M = TypeVar("M", bound=BaseModel)


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


class ListResult(_Result):
    path: str
    entries: list[FileEntry]
    truncated: bool


class StatResult(FileEntry):
    path: str


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


class _Reply(BaseModel):
    # Fields this side does not use are dropped, never trusted; types are not coerced.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class _WriteReply(_Reply):
    size: int = Field(ge=0)
    created: bool


class _ContentReply(_Reply):
    content_b64: str


class _ArchiveReply(_Reply):
    archive_b64: str


class _EntryReply(_Reply):
    name: str = Field(min_length=1, max_length=255)
    type: EntryType
    size: int = Field(ge=0)
    mode: int = Field(ge=0, le=0o7777)
    mtime: float = Field(allow_inf_nan=False)
    link_target: str | None = Field(default=None, max_length=256)

    def entry(self) -> dict[str, Any]:
        return {**self.model_dump(), "mode": f"{self.mode:04o}"}


class _ListReply(_Reply):
    entries: list[_EntryReply] = Field(max_length=MAX_LIST_ENTRIES)
    truncated: bool


class _CheckReply(_Reply):
    real_path: str = Field(max_length=MAX_PATH_CHARS)
    exists: bool
    type: EntryType | None


class _ExtractReply(_Reply):
    entries: int = Field(ge=0)
    size: int = Field(ge=0)


_HELPER_ERRORS: dict[str, type[OrchestratorError]] = {
    "invalid_argument": InvalidArgumentError,
    "quota_exceeded": QuotaExceededError,
}


class SessionFiles:
    """The files of one session container, all under /workspace."""

    def __init__(self, backend: DockerBackend, container_id: str, policy: Policy) -> None:
        self._backend = backend
        self._container_id = container_id
        self._limit = policy.limits.max_file_bytes

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
        if not isinstance(make_parents, bool):
            raise InvalidArgumentError("make_parents must be true or false")
        request = {"path": target, "content_b64": _b64(data), "make_parents": make_parents}
        reply = await self._call("write", request, _WriteReply)
        if reply.size != len(data):
            raise BackendError(f"the file helper wrote {reply.size} of {len(data)} bytes")
        return WriteResult(path=target, size=len(data), created=reply.created)

    async def read(self, path: Any) -> ReadResult:
        target = workspace_path(path)
        request = {"path": target, "max_bytes": self._limit}
        reply = await self._call("read", request, _ContentReply)
        data = _helper_b64(reply.content_b64, self._limit)
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
        reply = await self._call("list", request, _ListReply)
        entries = [FileEntry(**entry.entry()) for entry in reply.entries]
        return ListResult(path=target, entries=entries, truncated=reply.truncated)

    async def stat(self, path: Any) -> StatResult:
        """The entry at ``path``; a final symlink is described, not followed (as ``list``)."""
        target = workspace_path(path)
        reply = await self._call("stat", {"path": target}, _EntryReply)
        return StatResult(path=target, **reply.entry())

    async def check(self, path: Any) -> CheckResult:
        """Where ``path`` really is, following symlinks, refused if that is outside /workspace;
        e.g. for a caller-given working directory."""
        target = workspace_path(path)
        reply = await self._call("check", {"path": target}, _CheckReply)
        if not _inside(reply.real_path) or posixpath.normpath(reply.real_path) != reply.real_path:
            raise BackendError("the file helper resolved a path outside the workspace")
        return CheckResult(path=target, **reply.model_dump())

    async def upload(
        self, path: Any, *, tar_b64: Any = None, tar_bytes: Any = None
    ) -> UploadResult:
        """Extract a tar archive (plain or compressed) into the directory ``path``."""
        dest = workspace_path(path)
        archive = _archive_argument(tar_b64, tar_bytes, self._limit + TAR_OVERHEAD_BYTES)
        members = await anyio.to_thread.run_sync(_checked_members, archive, dest, self._limit)
        request = {"path": dest, "members": members}
        reply = await self._call("extract", request, _ExtractReply)
        return UploadResult(path=dest, entries=reply.entries, size=reply.size)

    async def download(self, path: Any) -> DownloadResult:
        """A tar of the file or directory ``path``, members named from its basename."""
        target = workspace_path(path)
        limit = self._limit + TAR_OVERHEAD_BYTES
        reply = await self._call("archive", {"path": target, "max_bytes": limit}, _ArchiveReply)
        data = _helper_b64(reply.archive_b64, limit)
        entries = await anyio.to_thread.run_sync(_count_members, data)
        return DownloadResult(path=target, size=len(data), entries=entries, tar_b64=_b64(data))

    async def _call(self, op: str, request: dict[str, Any], model: type[M]) -> M:
        payload = json.dumps(request).encode()
        limit = _b64_len(self._limit + TAR_OVERHEAD_BYTES) + REPLY_SLACK_BYTES
        spec = ExecSpec(argv=[*FILEOPS_ARGV, op])
        stream = await self._backend.open_exec(self._container_id, spec)
        try:
            stdout, stderr = await _exchange(stream, payload, limit)
        finally:
            await stream.aclose()
        reply = _decode_reply(stdout, stderr)
        try:
            return model.model_validate(reply)
        except pydantic.ValidationError as exc:
            raise BackendError(
                f"the file helper's {op} reply is malformed: {str(exc)[:1000]}"
            ) from None


async def _exchange(stream: ExecStream, payload: bytes, limit: int) -> tuple[bytes, bytes]:
    """Send the request while reading the reply, so neither side can block the other."""

    async def feed() -> None:
        try:
            for start in range(0, len(payload), SEND_CHUNK_BYTES):
                await stream.send(payload[start : start + SEND_CHUNK_BYTES])
            await stream.send_eof()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the helper stopped reading; its reply (or its absence) tells why

    # Errors are carried out of the task group by hand so they are not wrapped in a group.
    outcome: tuple[bytes, bytes] | OrchestratorError | None = None
    with anyio.move_on_after(OP_TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(feed)
            try:
                outcome = await _collect(stream, limit)
            except OrchestratorError as exc:
                outcome = exc
            group.cancel_scope.cancel()
    if outcome is None:
        raise ExecutionTimeoutError(f"the file operation did not finish in {OP_TIMEOUT:g} s")
    if isinstance(outcome, OrchestratorError):
        raise outcome
    return outcome


async def _collect(stream: ExecStream, limit: int) -> tuple[bytes, bytes]:
    """stdout up to ``limit`` bytes, and the tail of stderr for diagnostics."""
    out, err = bytearray(), b""
    while (chunk := await stream.receive()) is not None:
        stream_no, data = chunk
        if stream_no == STDERR:
            err = (err + data)[-STDERR_TAIL_BYTES:]
            continue
        out += data
        if len(out) > limit:
            raise BackendError(f"the file helper's reply is over {limit} bytes")
    return bytes(out), err


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _decode_reply(stdout: bytes, stderr: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(stdout, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        tail = stderr.decode("utf-8", "replace").strip()
        raise BackendError("the file helper gave no valid reply", hint=tail or None) from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise BackendError("the file helper's reply is not a reply object")
    if reply["ok"]:
        return reply
    message = reply.get("error_message")
    message = message[:MAX_MESSAGE_CHARS] if isinstance(message, str) else "no reason given"
    error = _HELPER_ERRORS.get(str(reply.get("error_type")))
    if error is None:
        raise BackendError(f"the file helper failed: {message}")
    raise error(message)


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
    if len(value) > 2 * _b64_len(limit):
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


def _helper_b64(value: str, limit: int) -> bytes:
    if len(value) > _b64_len(limit):
        raise BackendError(f"the file helper sent more than {limit} bytes")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BackendError("the file helper sent invalid base64") from None


def _inside(path: str) -> bool:
    normal = posixpath.normpath(path)
    return normal == WORKSPACE or normal.startswith(WORKSPACE + "/")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_len(size: int) -> int:
    return (size + 2) // 3 * 4


_TAR_ERRORS = (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError)


def _plain_tar(archive: bytes, limit: int) -> bytes:
    """The archive decompressed (gzip, bzip2, xz) to at most ``limit`` bytes. Done here, not by
    tarfile, because tarfile reads some headers whole at whatever size they claim: a small
    compressed archive could make it inflate gigabytes."""
    decompressor: Any
    if archive.startswith(b"\x1f\x8b"):
        decompressor = zlib.decompressobj(wbits=31)
    elif archive.startswith(b"BZh"):
        decompressor = bz2.BZ2Decompressor()
    elif archive.startswith(b"\xfd7zXZ\x00"):
        decompressor = lzma.LZMADecompressor()
    else:
        return archive
    try:
        plain: bytes = decompressor.decompress(archive, limit + 1)
    except _TAR_ERRORS as exc:
        raise InvalidArgumentError(f"the archive does not decompress: {exc}") from None
    if len(plain) > limit:
        raise InvalidArgumentError(f"the archive decompresses to over {limit} bytes")
    return plain


def _checked_members(archive: bytes, dest: str, limit: int) -> list[dict[str, Any]]:
    """The archive's members as the helper takes them, or invalid_argument for the first that
    is not allowed; content is read only while the running total stays within ``limit``."""
    members: list[dict[str, Any]] = []
    total = 0
    plain = _plain_tar(archive, limit + TAR_OVERHEAD_BYTES)
    try:
        with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
            for info in tar:
                if len(members) >= MAX_ARCHIVE_MEMBERS:
                    raise InvalidArgumentError(f"archive has over {MAX_ARCHIVE_MEMBERS} members")
                name = _member_name(info.name)
                if name is None:
                    continue  # "." or "./": the destination itself
                data = b""
                if info.isfile():
                    total += info.size
                    if total > limit:
                        raise InvalidArgumentError(f"archive content is over {limit} bytes")
                    extracted = tar.extractfile(info)
                    data = extracted.read() if extracted is not None else b""
                members.append(_member(info, name, dest, data))
    except _TAR_ERRORS as exc:
        raise InvalidArgumentError(f"not a readable tar archive: {exc}") from None
    _refuse_paths_through_links(members)
    return members


def _member_name(name: str) -> str | None:
    if "\0" in name:
        raise InvalidArgumentError(f"archive member {name[:256]!r} has a NUL byte in its name")
    if name.startswith("/"):
        raise InvalidArgumentError(f"archive member {name[:256]!r} has an absolute name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidArgumentError(f"archive member {name[:256]!r} climbs out with '..'")
    return "/".join(parts) or None


def _member(info: tarfile.TarInfo, name: str, dest: str, data: bytes) -> dict[str, Any]:
    mode = info.mode & 0o777
    if info.isdir():
        return {"name": name, "type": "dir", "mode": mode}
    if info.isfile():
        return {"name": name, "type": "file", "mode": mode, "content_b64": _b64(data)}
    if info.issym():
        target = info.linkname
        base = posixpath.dirname(posixpath.join(dest, name))
        if not target or "\0" in target or not _inside(posixpath.join(base, target)):
            raise InvalidArgumentError(f"archive symlink {name[:256]!r} points outside {WORKSPACE}")
        return {"name": name, "type": "symlink", "target": info.linkname}
    what = "a hard link" if info.islnk() else "a device, FIFO or other special file"
    raise InvalidArgumentError(f"archive member {name[:256]!r} is {what}, which is not allowed")


def _refuse_paths_through_links(members: list[dict[str, Any]]) -> None:
    """A member below another member that is a symlink would be written wherever that link
    leads: judged lexically, links chained that way can escape, so the archive is refused."""
    links = {member["name"] for member in members if member["type"] == "symlink"}
    for member in members:
        parts = member["name"].split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in links:
                raise InvalidArgumentError(
                    f"archive member {member['name'][:256]!r} lies below a symlink member"
                )


def _count_members(data: bytes) -> int:
    """How many members the helper's archive holds; also proves that it is a tar."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            return sum(1 for _ in tar)
    except _TAR_ERRORS:
        raise BackendError("the file helper's archive is not a readable tar") from None
