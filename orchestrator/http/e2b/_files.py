"""A sandbox's files as E2B sees them, over sandhold's ``files`` tool (read, write, list) and,
for what that tool has no operation for (make a directory, move, remove), one command in the
session's shell through the ``terminal`` tool, its paths quoted.

Stat is a listing of the parent directory: the files tool answers each entry's type, size,
mode and time, which is everything E2B's ``EntryInfo`` holds that sandhold keeps."""

from __future__ import annotations

import base64
import posixpath
import shlex
from typing import Any, Final

from orchestrator.http.e2b._paths import WORKSPACE, to_e2b
from orchestrator.http.e2b._sandboxes import E2bSandbox
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["Entry", "SandboxFiles"]

Entry = dict[str, Any]  # the files tool's entry, plus its sandhold ``path``
# ``rm -r`` and ``mv`` are what the SDK asked for by name; the policy's deny list still applies.
_CONFIRMED: Final = True


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

    async def _shell(self, command: str) -> dict[str, Any]:
        sandbox = self._sandbox
        return await call(
            self._orchestrator,
            sandbox.tenant,
            "terminal",
            "run",
            session_id=sandbox.session_id,
            command=command,
            confirm_dangerous=_CONFIRMED,
        )

    async def read(self, path: str) -> bytes:
        got = await self._files("read", path=path)
        if got.get("content_b64") is not None:
            return base64.b64decode(got["content_b64"])
        return str(got.get("content") or "").encode("utf-8")

    async def write(self, path: str, data: bytes) -> None:
        await self._files("write", path=path, content_b64=base64.b64encode(data).decode("ascii"))

    async def list(self, path: str, depth: int = 1) -> list[Entry]:
        listed = await self._files("list", path=path)
        entries = []
        for entry in listed["entries"]:
            full = posixpath.join(listed["path"], entry["name"])
            entries.append({**entry, "path": full})
            if entry["type"] == "dir" and depth > 1:
                entries += await self.list(full, depth - 1)
        return entries

    async def stat(self, path: str) -> Entry | None:
        if path == WORKSPACE:
            return {"name": "user", "type": "dir", "size": 0, "mode": "0755", "mtime": 0.0,
                    "path": WORKSPACE}  # fmt: skip
        parent, name = posixpath.split(path)
        try:
            listed = await self.list(parent)
        except ToolCallError as exc:
            if exc.error_type == "path_not_found":
                return None
            raise
        return next((e for e in listed if e["name"] == name), None)

    async def make_dir(self, path: str) -> None:
        await self._checked(f"mkdir -p -- {shlex.quote(path)}")

    async def move(self, source: str, destination: str) -> None:
        await self._checked(f"mv -f -- {shlex.quote(source)} {shlex.quote(destination)}")

    async def remove(self, path: str) -> None:
        await self._checked(f"rm -rf -- {shlex.quote(path)}")

    async def _checked(self, command: str) -> None:
        ran = await self._shell(command + " 2>&1")
        if ran.get("exit_code") != 0:
            raise ToolCallError("invalid_argument", to_e2b(str(ran.get("stdout", "")).strip()))
