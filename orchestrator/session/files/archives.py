"""Host-side inspection of tar archives: an upload checked member by member before it travels on,
and a download from the file helper checked by the same rules before it goes out.

An uploaded archive is decompressed here with a size cap, then read member by member and refused
whole if any member is absolute, climbs with ``..``, is a device, FIFO or hard link, is a symlink
that leads out of /workspace, or lies below a symlink member; only checked members travel on, as
the plain data the file helper writes. Everything here is judged lexically: symlinks already in
the container are the helper's to resolve.

A download is the helper's reply, and anything in the container can forge that (the helper runs
as the sandbox user), so it is judged by the upload rules as if it were extracted where it came
from, hard links to an earlier file member allowed (tar stores a second name of a file so); the
client gets a tar written anew from the checked members only, so no header it might read
differently from Python's tarfile (pax records, GNU long names) travels on.

Pure and blocking (no I/O but on the bytes given): callers run these through
``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import base64
import bz2
import io
import lzma
import math
import posixpath
import tarfile
import zlib
from typing import Any

from orchestrator.backend.base import WORKSPACE
from orchestrator.errors import BackendError, InvalidArgumentError

__all__ = ["TAR_OVERHEAD_BYTES", "checked_download", "checked_members", "inside_workspace"]

# Headers and padding of a tar holding max_file_bytes of content.
TAR_OVERHEAD_BYTES = 1024 * 1024
MAX_ARCHIVE_MEMBERS = 10_000
# A member's time in a rewritten download stays in what an ustar header holds (up to 2242).
MAX_MTIME = 8**11 - 1

_TAR_ERRORS = (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError)


def inside_workspace(path: str) -> bool:
    """Whether ``path``, normalised lexically, is /workspace or below it."""
    normal = posixpath.normpath(path)
    return normal == WORKSPACE or normal.startswith(WORKSPACE + "/")


def checked_members(archive: bytes, dest: str, limit: int) -> list[dict[str, Any]]:
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


def checked_download(archive: bytes, parent: str) -> tuple[bytes, int]:
    """The file helper's archive of an entry of the directory ``parent``, written anew from its
    members once each passed the upload rules for ``parent``, and how many there are; a
    ``BackendError`` for the first that does not (only a forged reply holds one)."""
    out = io.BytesIO()
    members: list[dict[str, Any]] = []
    try:
        with (
            tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as source,
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as copy,
        ):
            for info in source:
                name = _member_name(info.name)
                if name is None:
                    raise InvalidArgumentError("an archive member names the directory it is in")
                clean = _download_member(info, name, parent)
                data = source.extractfile(info) if info.isfile() else None
                copy.addfile(clean, data)
                members.append({"name": name, "type": "symlink" if clean.issym() else "other"})
        _refuse_paths_through_links(members)
    except InvalidArgumentError as exc:
        raise BackendError(
            f"the file helper's archive was refused: {exc.message}",
            hint="something in the session altered or forged the helper's reply",
        ) from None
    except _TAR_ERRORS:
        raise BackendError("the file helper's archive is not a readable tar") from None
    return out.getvalue(), len(members)


def _download_member(info: tarfile.TarInfo, name: str, parent: str) -> tarfile.TarInfo:
    """A fresh header for one member of a download: name, type, permission bits, size, time and
    link target, nothing else of what the helper wrote."""
    clean = tarfile.TarInfo(name)
    clean.mode = info.mode & 0o777
    mtime = info.mtime
    clean.mtime = int(min(max(mtime, 0), MAX_MTIME)) if math.isfinite(mtime) else 0
    if info.isfile():
        clean.size = info.size
    elif info.isdir():
        clean.type = tarfile.DIRTYPE
    else:
        checked = _member(info, name, parent, b"")  # a symlink inside, or refused
        clean.type, clean.linkname = tarfile.SYMTYPE, checked["target"]
    return clean


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
        content_b64 = base64.b64encode(data).decode("ascii")
        return {"name": name, "type": "file", "mode": mode, "content_b64": content_b64}
    if info.issym():
        target = info.linkname
        base = posixpath.dirname(posixpath.join(dest, name))
        if not target or "\0" in target or not inside_workspace(posixpath.join(base, target)):
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
