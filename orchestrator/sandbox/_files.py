"""A sandbox's files under /workspace, over the ``files`` tool: read, write, list, look up,
remove, move, make directories, and tar archives in and out. A path outside /workspace, or one
through a symlink leading out of it, is refused (``invalid_argument``), never answered False."""

from __future__ import annotations

import base64
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
        """Whether an entry is at ``path``; a symlink is one, wherever it points."""
        return bool((await self._calls(FILES, "exists", path=path)).get("exists"))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a symlink (not what it points at) or an empty directory; a
        directory with everything in it only with ``recursive``."""
        await self._calls(FILES, "remove", path=path, recursive=recursive)

    async def rename(self, path: str, new_path: str, *, overwrite: bool = False) -> str:
        """Move ``path`` to ``new_path`` (its directory must exist); an entry already there is
        replaced only with ``overwrite``. The new absolute path."""
        moved = await self._calls(
            FILES, "rename", path=path, new_path=new_path, overwrite=overwrite
        )
        return str(moved.get("new_path", new_path))

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        """A directory at ``path`` (missing parents too, unless ``parents=False``); False
        when it was there already."""
        return bool(
            (await self._calls(FILES, "make_dir", path=path, parents=parents)).get("created")
        )

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
