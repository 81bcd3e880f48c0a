"""Directory watches inside the sandbox (E2B's ``watch_dir``): stdlib only, inotify through
ctypes. Served, as the file helper's served mode is (``fileops.py``, ``wire.py``'s framing):

    python3 -I /opt/sandhold/worker/watcher.py <max_line_bytes> <idle_s>

One request per line, ``{"id", "op", ...}``, each answered by one line with that ``id``:

- ``add`` ``{path, recursive, include_entry}``: a watch of the directory ``path`` (and, with
  ``recursive``, of every directory under it, those made later included) -> ``{watch_id}``.
- ``events`` ``{watch_id}``: what happened since the last ``events`` -> ``{events, overflowed}``,
  each event ``{name, type}`` (``name`` relative to the watched directory; ``type`` one of
  create, write, remove, rename, chmod) and, with ``include_entry``, the entry as ``list``
  describes it when it still exists.
- ``remove`` ``{watch_id}``: the watch ends.

Events are read as they happen, between requests too, so a directory made in a recursive watch is
watched at once; and every pending event is read before a reply, so an ``events`` request sees
everything the sandbox did before it was sent. The file helper writes through a temporary file
and a rename; the events of such a file are reported as the file's own (created, written, its
mode set), not as a temporary name's. Everything is bounded: watches, directories per watch,
events kept per watch (past it ``overflowed``), events per reply. It ends at EOF on stdin and
after ``idle_s`` with no request while no watch is kept.

Paths are confined as the file helper confines them (``fileops.resolve``): a watch outside
/workspace, or through a link leading out, is refused; subdirectories are walked without
following links. The container is the security boundary; this keeps the tool's contract.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import posixpath
import re
import secrets
import select
import struct
import sys
from typing import Any

if __name__ == "__main__" and not __package__:
    # Run as a script: -I left this folder off sys.path (as fileops.py does).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

from .fileops import MAX_ID_CHARS, Refused, describe, encode, failure, lexical, resolve, text

MAX_WATCHES = 32
MAX_DIRS_PER_WATCH = 4096
MAX_KEPT_EVENTS = 10_000
MAX_REPLY_EVENTS = 2000
MAX_IDLE_S = 86_400.0
READ_BYTES = 64 * 1024

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
WATCH_MASK = (
    IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
)  # fmt: skip
# The kinds of event, as fsnotify (and so E2B's envd) names them, by inotify bit.
KINDS = (
    (IN_CREATE, "create"),
    (IN_MOVED_TO, "create"),
    (IN_MODIFY, "write"),
    (IN_DELETE, "remove"),
    (IN_MOVED_FROM, "rename"),
    (IN_ATTRIB, "chmod"),
)
HEADER = struct.Struct("iIII")
# The file helper's temporary names (fileops.temp_name).
TEMPORARY = re.compile(r"\.sandhold-[0-9a-f]{16}\.tmp")
MAX_HELD = 64

_libc = ctypes.CDLL(None, use_errno=True)


def _checked(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class Watch:
    """One inotify instance: a directory, or a tree of them."""

    def __init__(self, root: str, *, recursive: bool, include_entry: bool) -> None:
        self.root = root
        self.recursive = recursive
        self.include_entry = include_entry
        self.fd = _checked(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        self.dirs: dict[int, str] = {}  # watch descriptor -> path relative to root ("" root)
        self.events: list[dict[str, Any]] = []
        self.overflowed = False
        # The events of a temporary file of the file helper, until it is renamed into place.
        self.held: dict[tuple[int, str], list[str]] = {}
        self.moving: dict[int, list[str]] = {}
        try:
            self._add_dir("", first=True)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def _add_dir(self, relative: str, *, first: bool = False) -> None:
        if len(self.dirs) >= MAX_DIRS_PER_WATCH:
            self.overflowed = True
            return
        path = posixpath.join(self.root, relative) if relative else self.root
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            if first:
                _checked(wd, path)
            return  # gone or replaced by a link meanwhile: nothing to watch there
        self.dirs[wd] = relative
        if not self.recursive:
            return
        try:
            with os.scandir(path) as scan:
                found = [(item.name, item.is_dir(follow_symlinks=False)) for item in scan]
        except OSError:
            return
        for name, is_dir in found:
            child = posixpath.join(relative, name) if relative else name
            if not first:
                # Made before its directory's watch was: report it as made.
                if TEMPORARY.fullmatch(name):
                    self.held[(wd, name)] = ["create", "write"]
                else:
                    self._record(child, "create")
            if is_dir:
                self._add_dir(child)

    def drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return
            if not data:
                return
            offset = 0
            while offset + HEADER.size <= len(data):
                wd, mask, cookie, size = HEADER.unpack_from(data, offset)
                raw = data[offset + HEADER.size : offset + HEADER.size + size]
                offset += HEADER.size + size
                self._event(wd, mask, cookie, os.fsdecode(raw.split(b"\0", 1)[0]))

    def _event(self, wd: int, mask: int, cookie: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self.overflowed = True
            return
        if mask & IN_IGNORED:
            self.dirs.pop(wd, None)
            return
        parent = self.dirs.get(wd)
        if parent is None or not name:
            return  # the directory itself (deleted or moved): its parent reports it
        relative = posixpath.join(parent, name) if parent else name
        if TEMPORARY.fullmatch(name):
            self._temporary(wd, mask, cookie, name)
            return
        if mask & IN_MOVED_TO and cookie in self.moving:
            for kind in self.moving.pop(cookie):
                self._record(relative, kind)
        else:
            for bit, kind in KINDS:
                if mask & bit:
                    self._record(relative, kind)
        if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            self._add_dir(relative)

    def _temporary(self, wd: int, mask: int, cookie: int, name: str) -> None:
        key = (wd, name)
        if mask & IN_MOVED_FROM:
            if len(self.moving) < MAX_HELD:
                self.moving[cookie] = self.held.pop(key, [])
            return
        if mask & IN_DELETE:
            self.held.pop(key, None)
            return
        if key not in self.held and len(self.held) >= MAX_HELD:
            return
        kinds = self.held.setdefault(key, [])
        for bit, kind in KINDS:
            if mask & bit and len(kinds) < MAX_HELD and (not kinds or kinds[-1] != kind):
                kinds.append(kind)

    def _record(self, relative: str, kind: str) -> None:
        if len(self.events) >= MAX_KEPT_EVENTS:
            self.overflowed = True
            return
        event: dict[str, Any] = {"name": text(relative), "type": kind}
        if self.include_entry:
            entry = _entry(posixpath.join(self.root, relative))
            if entry is not None:
                event["entry"] = entry
        self.events.append(event)

    def take(self) -> dict[str, Any]:
        taken, self.events = self.events[:MAX_REPLY_EVENTS], self.events[MAX_REPLY_EVENTS:]
        overflowed, self.overflowed = self.overflowed, False
        return {"events": taken, "overflowed": overflowed}


def _entry(path: str) -> dict[str, Any] | None:
    """``path`` as ``list`` describes it, if it is still there (its parent by descriptor)."""
    parent, name = posixpath.split(path)
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return {
            "path": text(path),
            **describe(name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False), dir_fd),
        }
    except OSError:
        return None
    finally:
        os.close(dir_fd)


class Watches:
    def __init__(self) -> None:
        self.by_id: dict[str, Watch] = {}

    def drain(self) -> None:
        for watch in self.by_id.values():
            watch.drain()

    def answer(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        if op == "add":
            return self._add(request)
        watch_id = request.get("watch_id")
        watch = self.by_id.get(watch_id) if isinstance(watch_id, str) else None
        if watch is None:
            return failure("path_not_found", "no such watch (it ended, or its helper did)")
        if op == "events":
            return {"ok": True, **watch.take()}
        if op == "remove":
            del self.by_id[watch_id]  # type: ignore[arg-type]  # found above, so a str
            watch.close()
            return {"ok": True}
        return failure("invalid_argument", f"unknown operation {op[:64]!r}")

    def _add(self, request: dict[str, Any]) -> dict[str, Any]:
        if len(self.by_id) >= MAX_WATCHES:
            return failure("quota_exceeded", f"at most {MAX_WATCHES} watches per sandbox")
        try:
            path = lexical(request.get("path"))
            real = resolve(path)
            if not os.path.isdir(real):
                if not os.path.lexists(real):
                    return failure("path_not_found", f"{path}: no such directory")
                return failure("invalid_argument", f"{path}: not a directory")
            watch = Watch(
                real,
                recursive=request.get("recursive") is True,
                include_entry=request.get("include_entry") is True,
            )
        except Refused as exc:
            return failure(exc.code, str(exc))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return failure("path_not_found", f"{request.get('path')}: no such directory")
            if exc.errno in (errno.EMFILE, errno.ENOSPC, errno.ENFILE):
                return failure("quota_exceeded", f"no more watches: {exc.strerror}")
            return failure("invalid_argument", f"{request.get('path')}: {exc.strerror}")
        watch_id = secrets.token_hex(8)
        self.by_id[watch_id] = watch
        return {"ok": True, "watch_id": watch_id}


def reply_to(watches: Watches, line: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(line)
    except (ValueError, MemoryError, RecursionError):
        return {"id": None, **failure("invalid_argument", "the request is not valid JSON")}
    request_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_ID_CHARS:
        return {"id": None, **failure("invalid_argument", "the request has no valid id")}
    op = raw.pop("op", "")
    del raw["id"]
    try:
        reply = watches.answer(op if isinstance(op, str) else "", raw)
    except Exception as exc:  # the one boundary: always answer
        reply = failure("internal", f"{type(exc).__name__}: {str(exc)[:1000]}")
    return {"id": request_id, **reply}


def serve(max_line: int, idle_s: float) -> int:
    from .wire import BadRequest, LineReader, write_line

    reader = LineReader(0, max_line)
    watches = Watches()
    while True:
        fds = [0, *(watch.fd for watch in watches.by_id.values())]
        readable, _, _ = select.select(fds, [], [], None if watches.by_id else idle_s)
        if not readable:
            return 0  # idle, and nothing watched: the host starts a fresh one when asked
        watches.drain()
        if 0 not in readable:
            continue
        try:
            line = reader.read_line()
        except BadRequest as exc:
            write_line(1, encode({"id": None, **failure("invalid_argument", str(exc))}) + b"\n")
            continue
        if line is None:
            return 0
        if line.strip():
            watches.drain()  # everything done before the request was sent
            write_line(1, encode(reply_to(watches, line)) + b"\n")


def main(argv: list[str]) -> int:
    try:
        max_line, idle_s = int(argv[1]), float(argv[2])
    except (IndexError, ValueError):
        sys.stderr.write("usage: watcher.py <max_line_bytes> <idle_s>\n")
        return 2
    if max_line <= 0 or not 0 < idle_s <= MAX_IDLE_S:
        sys.stderr.write("max_line_bytes and idle_s must be positive\n")
        return 2
    return serve(max_line, idle_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
