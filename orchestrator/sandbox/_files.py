"""A sandbox's files under /workspace, over the ``files`` tool: read, write, list, and tar
archives in and out. ``exists`` is a listing of the parent directory (the tool has no stat);
the tool has no remove, rename or make-directory, so neither has this (a command does them)."""

from __future__ import annotations

import base64
import posixpath
from typing import Literal

from orchestrator.errors import InvalidArgumentError
from orchestrator.sandbox._calls import AsyncPart, SessionCalls
from orchestrator.sandbox._results import FileInfo

__all__ = ["AsyncFiles"]

FILES = "files"
Format = Literal["auto", "text", "bytes"]


class AsyncFiles(AsyncPart):
    def __init__(self, calls: SessionCalls) -> None:
        self._calls = calls

    async def read(self, path: str, *, format: Format = "auto") -> str | bytes:
        """The file's content: with ``auto`` text when it is UTF-8 (without NUL bytes), bytes
        otherwise; ``text`` or ``bytes`` to choose."""
        answer = await self._calls(FILES, "read", path=path)
        content = answer.get("content")
        if isinstance(content, str):
            return content.encode("utf-8") if format == "bytes" else content
        data = base64.b64decode(answer.get("content_b64") or "")
        if format == "text":
            raise InvalidArgumentError(f"{path} is not UTF-8 text", hint="read it as bytes")
        return data

    async def write(self, path: str, data: str | bytes, *, make_parents: bool = True) -> int:
        """Write ``data`` (text as UTF-8); the size written."""
        if isinstance(data, str):
            written = await self._calls(
                FILES, "write", path=path, content=data, make_parents=make_parents
            )
        else:
            encoded = base64.b64encode(data).decode("ascii")
            written = await self._calls(
                FILES, "write", path=path, content_b64=encoded, make_parents=make_parents
            )
        return int(written.get("size", 0))

    async def list(self, path: str = ".") -> list[FileInfo]:
        listed = await self._calls(FILES, "list", path=path)
        return [
            FileInfo(
                name=e["name"],
                type=e["type"],
                size=e["size"],
                mode=e["mode"],
                mtime=e["mtime"],
                link_target=e.get("link_target"),
            )
            for e in listed.get("entries", [])
        ]

    async def exists(self, path: str) -> bool:
        parent, name = posixpath.split(posixpath.normpath(path))
        if not name or name in (".", ".."):
            return True  # the workspace itself, or a directory above what normpath kept
        try:
            entries = await self.list(parent or ".")
        except InvalidArgumentError:
            return False  # no such directory (or not one), so nothing in it
        return any(entry.name == name for entry in entries)

    async def upload(self, path: str, archive: bytes) -> int:
        """Extract a tar archive (optionally compressed) into the directory ``path``; the
        number of entries extracted."""
        encoded = base64.b64encode(archive).decode("ascii")
        done = await self._calls(FILES, "upload", path=path, tar_b64=encoded)
        return int(done.get("entries", 0))

    async def download(self, path: str) -> bytes:
        """A file or directory as a tar archive."""
        done = await self._calls(FILES, "download", path=path)
        return base64.b64decode(done.get("tar_b64") or "")
