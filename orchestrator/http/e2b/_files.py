"""A sandbox's files as E2B sees them, over sandhold's ``files`` tool (read, write, list, stat,
remove, rename, make_dir), confined to the session's /workspace as that tool confines them.

Two things E2B keeps that the tool has no operation for:

- **File metadata** (E2B's ``metadata=`` of a write): ``user.e2b.*`` extended attributes on the
  file, as envd keeps them. The tool's entries already report them (its file helper reads them);
  they are set by one command in the session's shell (``terminal`` ``run``: ``os.setxattr``, its
  arguments quoted). A write replaces the file (a new inode), so an overwrite without metadata
  leaves none behind, as in E2B.
- **Symlinks** are shown as E2B shows them: the type of what they point at, and the target as
  an absolute E2B path."""

from __future__ import annotations

import base64
import posixpath
import shlex
from typing import Any, Final

from orchestrator.http.e2b._paths import WORKSPACE, to_e2b
from orchestrator.http.e2b._sandboxes import E2bSandbox
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["XATTR_PREFIX", "Entry", "SandboxFiles"]

Entry = dict[str, Any]  # the files tool's entry, plus its sandhold ``path``
XATTR_PREFIX: Final = "user.e2b."
# The metadata of one write, set in one command: a path, then key and value pairs.
_SET_XATTRS: Final = (
    "import os,sys\n"
    "p, a = sys.argv[1], sys.argv[2:]\n"
    "for i in range(0, len(a), 2): os.setxattr(p, a[i], a[i + 1].encode(), follow_symlinks=False)"
)
# A symlink is followed this many times at most (as the kernel's ELOOP, but shorter).
_MAX_LINKS: Final = 8


class SandboxFiles:
    def __init__(self, orchestrator: Any, sandbox: E2bSandbox) -> None:
        self._orchestrator = orchestrator
        self._sandbox = sandbox

    async def _files(self, operation: str, **args: Any) -> dict[str, Any]:
        sandbox = self._sandbox
        return await call(
            self._orchestrator,
            sandbox.tenant,
            "files",
            operation,
            session_id=sandbox.session_id,
            **args,
        )

    async def read(self, path: str) -> bytes:
        got = await self._files("read", path=path)
        if got.get("content_b64") is not None:
            return base64.b64decode(got["content_b64"])
        return str(got.get("content") or "").encode("utf-8")

    async def write(self, path: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        await self._files("write", path=path, content_b64=base64.b64encode(data).decode("ascii"))
        if metadata:
            await self._set_metadata(path, metadata)

    async def _set_metadata(self, path: str, metadata: dict[str, str]) -> None:
        pairs = [part for key, value in metadata.items() for part in (XATTR_PREFIX + key, value)]
        sandbox = self._sandbox
        ran = await call(
            self._orchestrator,
            sandbox.tenant,
            "terminal",
            "run",
            session_id=sandbox.session_id,
            command=shlex.join(["python3", "-I", "-c", _SET_XATTRS, path, *pairs]) + " 2>&1",
            confirm_dangerous=True,  # what the SDK asked for by name; denied patterns still apply
        )
        if ran.get("exit_code") != 0:
            output = str(ran.get("stdout", "")).strip().splitlines()
            reason = output[-1] if output else "the command failed"
            raise ToolCallError("invalid_argument", f"metadata not set on {to_e2b(path)}: {reason}")

    async def list(self, path: str, depth: int = 1) -> list[Entry]:
        listed = await self._files("list", path=path)
        entries = []
        for entry in listed["entries"]:
            full = posixpath.join(listed["path"], entry["name"])
            entries.append(await self._shown({**entry, "path": full}))
            if entry["type"] == "dir" and depth > 1:
                entries += await self.list(full, depth - 1)
        return entries

    async def stat(self, path: str) -> Entry | None:
        """The entry at ``path`` as E2B shows it, or None when nothing is there."""
        try:
            found = await self._files("stat", path=path)
        except ToolCallError as exc:
            if exc.error_type == "path_not_found":
                return None
            raise
        entry = {k: v for k, v in found.items() if k not in ("success", "session_id")}
        if path == WORKSPACE:
            entry["name"] = "user"
        return await self._shown(entry)

    async def _shown(self, entry: Entry) -> Entry:
        """A symlink shown as E2B's envd shows it: the type of its final target (a dangling
        one stays a file) and that target's absolute path."""
        if entry["type"] != "symlink":
            return entry
        path, target = entry["path"], entry
        for _ in range(_MAX_LINKS):
            link = target.get("link_target")
            if target["type"] != "symlink" or not isinstance(link, str):
                break
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), link))
            try:
                target = await self._files("stat", path=path)
            except ToolCallError:
                target = {"type": "file"}  # dangling, or outside the workspace
                break
        kind = target["type"] if target["type"] in ("file", "dir") else "file"
        return {**entry, "type": kind, "link_target": path, "is_symlink": True}

    async def make_dir(self, path: str) -> bool:
        """Whether a directory was made (False: something was there already)."""
        made = await self._files("make_dir", path=path, parents=True)
        return bool(made.get("created"))

    async def move(self, source: str, destination: str) -> None:
        await self._files("rename", path=source, new_path=destination, overwrite=True)

    async def remove(self, path: str) -> None:
        """Remove the entry (a directory with what is in it); nothing there is no error."""
        try:
            await self._files("remove", path=path, recursive=True)
        except ToolCallError as exc:
            if exc.error_type != "path_not_found":
                raise
