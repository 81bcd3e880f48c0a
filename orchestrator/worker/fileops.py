"""File operations inside the sandbox, for the ``files`` tool: stdlib only. Two ways to run it:

    python3 -I /opt/sandhold/worker/fileops.py <op>   (one request: one JSON object on stdin)
    python3 -I /opt/sandhold/worker/fileops.py --serve <max_line_bytes> <idle_s>

Run with an operation, it answers one JSON object on stdout: ``{"ok": true, ...}`` or ``{"ok":
false, "error_type", "error_message"}``. Served, it is the session's long-lived file helper and
speaks the REPL worker's framing (``wire.py``): one request per line, ``{"id", "op", ...}``, each
answered by one line, the same reply with the request's ``id`` (null for a line it could not
read). It ends at EOF on stdin (its host closed the stream, or went away) and after ``idle_s``
without a request, so an idle session does not keep it; it never holds the host lease
(``lease.py``), so it neither keeps an orphaned container alive nor is needed to.

The host confines paths lexically; this half judges what only the container
can see, symlinks: every path is resolved with ``realpath`` and refused when it leads out of
/workspace (dangling links and links in parent directories included), final components are opened
with O_NOFOLLOW, and each opened descriptor is checked again through /proc, so a link swapped in
after the check is caught. Writes go to a temporary file in the same directory, then a rename.

The helper runs as the sandbox user, like everything else in the container; these checks keep the
tool's contract (paths stay in /workspace), the container is the security boundary.
"""

from __future__ import annotations

import binascii
import errno
import io
import json
import os
import posixpath
import select
import stat
import sys
from typing import TYPE_CHECKING

if __name__ == "__main__" and not __package__:
    # Run as a script: -I left this folder off sys.path. Import the folder as a package (named
    # after it), as repl_worker.py does, so the served mode can use wire.py's line reader.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

# A one-shot run pays for its imports (one exec per operation): tarfile, secrets, base64 and
# typing would add tens of milliseconds each, so they are left out or imported where needed.
if TYPE_CHECKING:
    import tarfile
    from collections.abc import Callable
    from typing import Any

WORKSPACE = "/workspace"
# Bounds the host sets per request; these caps hold even if a request asks for more.
MAX_LIST_ENTRIES = 2000
MAX_LINK_TARGET_CHARS = 256
# File metadata (E2B's): extended attributes in this namespace, at most this many, each key and
# value at most this long.
XATTR_PREFIX = "user.e2b."
MAX_METADATA_KEYS = 32
MAX_METADATA_CHARS = 1024
MAX_MEMBERS = 10_000
# Request ids are the host's, as in the REPL worker's protocol (wire.MAX_ID_CHARS).
MAX_ID_CHARS = 64
# Served mode: a day without a request is not a session at work (the host asks for far less).
MAX_IDLE_S = 86_400.0
# Served mode: after a request and reply larger than this, the heap is trimmed (~1 ms).
TRIM_AFTER_BYTES = 1 << 20
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A missing path has a code of its own, so that no interface reads the message to say "not found".
_MISSING = {errno.ENOENT: "no such file or directory"}
_INVALID = {
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
    errno.ENOTEMPTY: "directory not empty",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ELOOP: "is a symlink, which this operation does not follow",
    errno.ENAMETOOLONG: "name too long",
    errno.EROFS: "read-only file system",
    errno.ENXIO: "not a regular file",
    # rename(2) says so for a directory moved into itself (through a link the host cannot see).
    errno.EINVAL: "not possible for this entry (a directory moved into itself?)",
    errno.EBUSY: "in use by the system (a mount point)",
}
_FULL = {
    errno.ENOSPC: "the workspace is full",
    errno.EDQUOT: "the workspace is full",
    errno.EFBIG: "larger than the sandbox's file size limit",
}


class Refused(Exception):
    """The request cannot be done as asked; the message says why."""

    code = "invalid_argument"


class Missing(Refused):
    """A directory on the way is not there: as missing as the entry itself."""

    code = "path_not_found"


class Full(Refused):
    """A size limit of the sandbox (workspace tmpfs, fsize) stopped the operation."""

    code = "quota_exceeded"


def inside(path: str) -> bool:
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


def lexical(path: Any) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise Refused("path must be an absolute path without NUL bytes")
    normal = posixpath.normpath(path)
    if not inside(normal):
        raise Refused(f"{path} is outside {WORKSPACE}")
    return normal


def resolve(path: str) -> str:
    """The real path of ``path``, refused if a symlink on the way (or at the end) leads out."""
    real = os.path.realpath(path)
    if not inside(real):
        raise Refused(f"{path} leads outside {WORKSPACE} through a symlink")
    return real


def check_fd(fd: int, path: str) -> None:
    """The descriptor really is under /workspace (a link swapped in after ``resolve`` is not)."""
    if not inside(os.readlink(f"/proc/self/fd/{fd}")):
        raise Refused(f"{path} leads outside {WORKSPACE} through a symlink")


def open_dir(path: str, *, create: bool) -> int:
    real = resolve(path)
    if create and not os.path.lexists(real):
        os.makedirs(real, mode=0o755, exist_ok=True)
    if not os.path.isdir(real):
        if not os.path.lexists(real):
            raise Missing(f"{path}: no such directory")
        raise Refused(f"{path}: not a directory")
    fd = os.open(real, _OPEN_DIR)
    try:
        check_fd(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"


def text(name: str) -> str:
    """A file name as JSON can carry it: bytes that are not UTF-8 become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def describe(name: str, st: os.stat_result, dir_fd: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": text(name),
        "type": kind(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    if stat.S_ISLNK(st.st_mode):
        target = text(os.readlink(name, dir_fd=dir_fd))
        entry["link_target"] = target[:MAX_LINK_TARGET_CHARS]
    else:
        metadata = xattr_metadata(name, dir_fd)
        if metadata:
            entry["metadata"] = metadata
    return entry


def xattr_metadata(name: str, dir_fd: int | None) -> dict[str, str]:
    """The entry's ``user.e2b.*`` extended attributes (E2B's file metadata), bounded, as text;
    empty where the file system keeps none. A path, not a descriptor: the xattr calls take no
    ``dir_fd``, so the parent's own path is read back from /proc, and a link is never followed."""
    where = name if dir_fd is None else f"/proc/self/fd/{dir_fd}/{name}"
    try:
        names = os.listxattr(where, follow_symlinks=False)
    except OSError:
        return {}
    found: dict[str, str] = {}
    for attribute in sorted(names):
        if not attribute.startswith(XATTR_PREFIX) or len(found) >= MAX_METADATA_KEYS:
            continue
        try:
            value = os.getxattr(where, attribute, follow_symlinks=False)
        except OSError:
            continue
        key = attribute[len(XATTR_PREFIX) :]
        if key and len(key) <= MAX_METADATA_CHARS and len(value) <= MAX_METADATA_CHARS:
            found[text(key)] = value.decode("utf-8", "replace")
    return found


def decode_b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise Refused(f"{what} must be a base64 string")
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise Refused(f"{what} is not valid base64") from exc


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def temp_name() -> str:
    return f".sandhold-{os.urandom(8).hex()}.tmp"


def discard(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return  # never created, or already gone


def write_at(dir_fd: int, name: str, data: bytes, path: str, mode: int | None = None) -> bool:
    """Replace ``name`` in ``dir_fd`` with ``data`` atomically; True if it did not exist."""
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISLNK(old.st_mode):
        raise Refused(f"{path} is a symlink; writing through symlinks is not allowed")
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise Refused(f"{path} exists and is not a regular file")
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old is not None else 0o644
    temp = temp_name()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    try:
        with open(fd, "wb", closefd=True) as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
        # rename never follows a link at the target name, so a link swapped in is replaced.
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        discard(temp, dir_fd)
        raise
    return old is None


def op_write(request: dict[str, Any]) -> dict[str, Any]:
    path = lexical(request.get("path"))
    data = decode_b64(request.get("content_b64"), "content_b64")
    parent, name = posixpath.split(path)
    if path == WORKSPACE:
        raise Refused(f"{path} is a directory")
    dir_fd = open_dir(parent, create=request.get("make_parents") is True)
    try:
        created = write_at(dir_fd, name, data, path)
    finally:
        os.close(dir_fd)
    return {"path": path, "size": len(data), "created": created}


def op_read(request: dict[str, Any]) -> dict[str, Any]:
    path = lexical(request.get("path"))
    max_bytes = bounded_int(request.get("max_bytes"))
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(resolve(path), flags)
    with open(fd, "rb", closefd=True) as handle:
        check_fd(fd, path)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"{path} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file")
        if st.st_size > max_bytes:
            raise Refused(f"{path} is {st.st_size} bytes, more than the limit of {max_bytes}")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise Refused(f"{path} is more than the limit of {max_bytes} bytes")
    return {"path": path, "size": len(data), "content_b64": b64(data)}


def op_list(request: dict[str, Any]) -> dict[str, Any]:
    path = lexical(request.get("path"))
    limit = min(bounded_int(request.get("max_entries")), MAX_LIST_ENTRIES)
    fd = os.open(resolve(path), _OPEN_DIR)
    entries: list[dict[str, Any]] = []
    truncated = False
    try:
        check_fd(fd, path)
        with os.scandir(fd) as scan:
            for item in scan:
                if len(entries) >= limit:
                    truncated = True
                    break
                try:
                    st = item.stat(follow_symlinks=False)
                    entries.append(describe(item.name, st, fd))
                except FileNotFoundError:
                    continue  # removed while we listed
    finally:
        os.close(fd)
    entries.sort(key=lambda entry: str(entry["name"]))
    return {"path": path, "entries": entries, "truncated": truncated}


def op_stat(request: dict[str, Any]) -> dict[str, Any]:
    """The entry itself, like ``list`` shows it: a final symlink is described, not followed."""
    path = lexical(request.get("path"))
    if path == WORKSPACE:
        return {"path": path, **describe("workspace", os.stat(path), None)}
    parent, name = posixpath.split(path)
    dir_fd = open_dir(parent, create=False)
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return {"path": path, **describe(name, st, dir_fd)}
    finally:
        os.close(dir_fd)


def op_check(request: dict[str, Any]) -> dict[str, Any]:
    """Where ``path`` really is (refused if outside), whether it exists and what it is."""
    path = lexical(request.get("path"))
    real = resolve(path)
    try:
        found = kind(os.stat(real, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return {"path": path, "real_path": real, "exists": False, "type": None}
    return {"path": path, "real_path": real, "exists": True, "type": found}


def entry_at(path: str) -> tuple[int, str, os.stat_result]:
    """The open directory holding ``path`` (symlink-checked), the entry's name in it and the
    entry itself, not followed; refused for /workspace itself, which no operation here moves or
    removes. The caller closes the descriptor."""
    if path == WORKSPACE:
        raise Refused(f"{path} is the workspace itself")
    parent, name = posixpath.split(path)
    dir_fd = open_dir(parent, create=False)
    try:
        return dir_fd, name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except BaseException:
        os.close(dir_fd)
        raise


def op_exists(request: dict[str, Any]) -> dict[str, Any]:
    """Whether an entry is at ``path`` and what it is; a final symlink is an entry (not
    followed), a missing parent directory means no entry, a parent leading out is refused."""
    path = lexical(request.get("path"))
    if path == WORKSPACE:
        return {"path": path, "exists": True, "type": "dir"}
    parent, name = posixpath.split(path)
    if not os.path.isdir(resolve(parent)):
        return {"path": path, "exists": False, "type": None}
    dir_fd = open_dir(parent, create=False)
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return {"path": path, "exists": False, "type": None}
    finally:
        os.close(dir_fd)
    return {"path": path, "exists": True, "type": kind(st.st_mode)}


def op_remove(request: dict[str, Any]) -> dict[str, Any]:
    """Remove the entry at ``path``: a file or a link (the link, never its target), an empty
    directory, or with ``recursive`` a directory and everything in it. The tree is walked by
    descriptors without following a link (``shutil.rmtree`` with ``dir_fd``), so a link in it,
    or one swapped in meanwhile, is removed as a link and nothing outside is touched."""
    path = lexical(request.get("path"))
    recursive = request.get("recursive") is True
    dir_fd, name, st = entry_at(path)
    try:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
        elif recursive:
            import shutil

            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.rmdir(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return {"path": path, "type": kind(st.st_mode)}


def op_rename(request: dict[str, Any]) -> dict[str, Any]:
    """Move the entry at ``path`` to ``new_path`` (both in /workspace, the new one's directory
    existing); an entry already at ``new_path`` is replaced only with ``overwrite``. A link is
    moved as a link. Without ``overwrite`` the check and the move are two steps: something in
    the sandbox may put an entry there between them, which it could replace itself anyway."""
    path = lexical(request.get("path"))
    new_path = lexical(request.get("new_path"))
    overwrite = request.get("overwrite") is True
    if new_path == path:
        raise Refused(f"{path} and new_path are the same")
    if new_path.startswith(path + "/"):
        raise Refused(f"{new_path} is inside {path}: a directory cannot move into itself")
    src_fd, name, _ = entry_at(path)
    try:
        if new_path == WORKSPACE:
            raise Refused(f"{new_path} is the workspace itself")
        new_parent, new_name = posixpath.split(new_path)
        dst_fd = open_dir(new_parent, create=False)
        try:
            try:
                os.stat(new_name, dir_fd=dst_fd, follow_symlinks=False)
                replaced = True
            except FileNotFoundError:
                replaced = False
            if replaced and not overwrite:
                raise Refused(f"{new_path} already exists (overwrite replaces it)")
            # rename never follows a link at either name: the entries themselves move.
            os.rename(name, new_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    return {"path": path, "new_path": new_path, "replaced": replaced}


def op_make_dir(request: dict[str, Any]) -> dict[str, Any]:
    """A directory at ``path`` (its missing parents too with ``parents``); ``created`` is False
    when one was there already, and anything else there is refused."""
    path = lexical(request.get("path"))
    if path == WORKSPACE:
        return {"path": path, "created": False}
    parent, name = posixpath.split(path)
    dir_fd = open_dir(parent, create=request.get("parents") is True)
    try:
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise Refused(f"{path} exists and is not a directory") from None
            return {"path": path, "created": False}
    finally:
        os.close(dir_fd)
    return {"path": path, "created": True}


class BoundedBuffer(io.BytesIO):
    def __init__(self, limit: int, path: str) -> None:
        super().__init__()
        self.limit = limit
        self.path = path

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.limit:
            raise Refused(f"an archive of {self.path} is more than the limit of {self.limit} bytes")
        return super().write(data)


def archive_filter(parent: str) -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    """What goes into an archive of an entry of ``parent``: files, directories, and symlinks that
    stay in /workspace judged lexically from where they are, as the host judges the archive
    (it refuses an archive with anything else); hard links' second names are left out too."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isfile() or info.isdir() or info.issym()):
            return None  # devices, FIFOs and sockets have no content to hand out
        if info.issym():
            here = posixpath.dirname(posixpath.join(parent, info.name))
            target = posixpath.normpath(posixpath.join(here, info.linkname))
            if not info.linkname or not inside(target):
                return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    return keep


def op_archive(request: dict[str, Any]) -> dict[str, Any]:
    """A tar of ``path`` (file or directory, recursively), members named from its basename;
    symlinks that lead out of /workspace are left out (``archive_filter``)."""
    path = lexical(request.get("path"))
    real = resolve(path)
    max_bytes = bounded_int(request.get("max_bytes"))
    os.stat(real, follow_symlinks=False)  # a missing path is "no such file", not an empty tar
    import tarfile

    buffer = BoundedBuffer(max_bytes, path)
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # tarfile.add stores symlinks as links (dereference is off): nothing outside is read.
        keep = archive_filter(posixpath.dirname(path))
        tar.add(real, arcname=posixpath.basename(path), recursive=True, filter=keep)
    data = buffer.getvalue()
    return {"path": path, "size": len(data), "archive_b64": b64(data)}


def member_path(dest: str, member: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(member, dict) or not isinstance(member.get("name"), str):
        raise Refused("each member needs a name")
    name = member["name"]
    parts = name.split("/")
    if not name or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise Refused(f"member name {name!r} must be a plain relative path")
    return lexical(posixpath.join(dest, name)), member


def check_member(path: str, member: dict[str, Any]) -> None:
    """Refusals that need no writes: parents or link targets that lead out of /workspace, and
    entries already there that the member may not replace (links, directories)."""
    parent = resolve(posixpath.dirname(path))
    existing = posixpath.join(parent, posixpath.basename(path))
    if os.path.islink(existing) and member.get("type") != "symlink":
        raise Refused(f"{path} is a symlink; writing through symlinks is not allowed")
    if os.path.isdir(existing) and not os.path.islink(existing) and member.get("type") != "dir":
        raise Refused(f"{path} is a directory")
    if member.get("type") == "symlink":
        target = member.get("target")
        if not isinstance(target, str) or not target or "\0" in target:
            raise Refused(f"symlink {path} needs a target")
        if not inside(os.path.realpath(posixpath.join(parent, target))):
            raise Refused(f"symlink {path} points outside {WORKSPACE}")
    elif member.get("type") not in ("file", "dir"):
        raise Refused(f"member {path} has an unsupported type")


def extract_member(path: str, member: dict[str, Any]) -> int:
    check_member(path, member)  # again: earlier members may have changed what the path means
    parent, name = posixpath.split(path)
    mode = bounded_int(member.get("mode", 0o644)) & 0o777
    dir_fd = open_dir(parent, create=True)
    try:
        if member["type"] == "dir":
            try:
                os.mkdir(name, mode | 0o700, dir_fd=dir_fd)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise Refused(f"{path} exists and is not a directory") from None
            return 0
        if member["type"] == "symlink":
            temp = temp_name()
            os.symlink(member["target"], temp, dir_fd=dir_fd)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return 0
        data = decode_b64(member.get("content_b64"), f"content of {path}")
        write_at(dir_fd, name, data, path, mode)
        return len(data)
    finally:
        os.close(dir_fd)


def op_extract(request: dict[str, Any]) -> dict[str, Any]:
    """Write archive members (already checked on the host) under the directory ``path``."""
    dest = lexical(request.get("path"))
    raw = request.get("members")
    if not isinstance(raw, list) or len(raw) > MAX_MEMBERS:
        raise Refused(f"members must be a list of at most {MAX_MEMBERS}")
    members = [member_path(dest, member) for member in raw]
    resolve(dest)
    for path, member in members:
        check_member(path, member)
    os.close(open_dir(dest, create=True))
    size = sum(extract_member(path, member) for path, member in members)
    return {"path": dest, "entries": len(members), "size": size}


def bounded_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**40:
        raise Refused("a size or count in the request is not a non-negative integer")
    return value


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "archive": op_archive,
    "check": op_check,
    "exists": op_exists,
    "extract": op_extract,
    "list": op_list,
    "make_dir": op_make_dir,
    "read": op_read,
    "remove": op_remove,
    "rename": op_rename,
    "stat": op_stat,
    "write": op_write,
}


def failure(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error_type": code, "error_message": message}


def handle(op: str, request: Any) -> dict[str, Any]:
    handler = OPS.get(op)
    if handler is None:
        return failure("invalid_argument", f"unknown operation {op[:64]!r}")
    if not isinstance(request, dict):
        return failure("invalid_argument", "the request must be a JSON object")
    where = str(request.get("path"))[:4096]
    try:
        return {"ok": True, **handler(request)}
    except Refused as exc:
        return failure(exc.code, str(exc))
    except OSError as exc:
        if exc.errno in _FULL:
            return failure("quota_exceeded", f"{where}: {_FULL[exc.errno]}")
        if exc.errno in _MISSING:
            return failure("path_not_found", f"{where}: {_MISSING[exc.errno]}")
        if exc.errno in _INVALID:
            return failure("invalid_argument", f"{where}: {_INVALID[exc.errno]}")
        return failure("internal", f"{where}: {exc.strerror or type(exc).__name__}")


def answer(op: str, request: Any) -> dict[str, Any]:
    """The reply to one request, whatever happens: never a bare traceback."""
    try:
        return handle(op, request)
    except Exception as exc:  # the one boundary: always answer
        return failure("internal", f"{type(exc).__name__}: {str(exc)[:1000]}")


def encode(reply: dict[str, Any]) -> bytes:
    # json.dumps escapes every control character, so a reply is one line in served mode too.
    return json.dumps(reply, ensure_ascii=False).encode("utf-8", "replace")


def served_reply(line: bytes) -> dict[str, Any]:
    """The reply to one request line of served mode, tagged with the request's id."""
    try:
        raw = json.loads(line)
    except (ValueError, MemoryError, RecursionError):
        return {"id": None, **failure("invalid_argument", "the request is not valid JSON")}
    request_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_ID_CHARS:
        return {"id": None, **failure("invalid_argument", "the request has no valid id")}
    op = raw.pop("op", "")
    del raw["id"]
    return {"id": request_id, **answer(op if isinstance(op, str) else "", raw)}


def serve(max_line: int, idle_s: float) -> int:
    """Answer request lines until EOF or ``idle_s`` without one.

    The host sends a request only once the previous one is answered, so after a line is read
    the reader's buffer is empty and waiting on the descriptor is waiting for the next request
    (a line that code in the sandbox writes into our stdin can only delay its own session)."""
    from .wire import BadRequest, LineReader, write_line

    reader = LineReader(0, max_line)
    while True:
        readable, _, _ = select.select([0], [], [], idle_s)
        if not readable:
            return 0  # idle: the host starts a fresh helper for its next request
        try:
            line = reader.read_line()
        except BadRequest as exc:
            write_line(1, encode({"id": None, **failure("invalid_argument", str(exc))}) + b"\n")
            continue
        if line is None:
            return 0
        if not line.strip():
            continue
        reply = encode(served_reply(line)) + b"\n"
        write_line(1, reply)
        large = len(line) + len(reply) > TRIM_AFTER_BYTES
        del line, reply
        if large:
            release_memory()


def release_memory() -> None:
    """Hand the heap's free pages back to the kernel. glibc keeps what a large request used (it
    raises its mmap threshold once a large buffer is freed, and trims its heap only at the top):
    a helper that moved a 10 MiB file held ~20 MiB of the session's memory, ~6 MiB after this."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (ImportError, OSError, AttributeError):
        return  # not glibc: the memory goes back when the helper exits


def serve_arguments(argv: list[str]) -> tuple[int, float] | None:
    if len(argv) != 4 or argv[1] != "--serve":
        return None
    try:
        max_line, idle_s = int(argv[2]), float(argv[3])
    except ValueError:
        return None
    return (max_line, idle_s) if max_line > 0 and 0 < idle_s <= MAX_IDLE_S else None


def main(argv: list[str]) -> int:
    served = serve_arguments(argv)
    if served is not None:
        return serve(*served)
    op = argv[1] if len(argv) == 2 else ""
    try:
        request = json.loads(sys.stdin.buffer.read())
    except (ValueError, MemoryError):
        reply = failure("invalid_argument", "the request is not valid JSON")
    else:
        reply = answer(op, request)
    sys.stdout.buffer.write(encode(reply))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
