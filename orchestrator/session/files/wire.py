"""The replies of the in-container file helper (``worker/fileops.py``), host side; the run itself
is ``helper_exchange``'s (one JSON request on its stdin, one JSON reply on its stdout).

Everything the helper says is untrusted: the reply models below drop unused fields and never
coerce types, and base64 from the helper is bounded before it is decoded; anything else is a
``BackendError``. Only the helper's own ``invalid_argument`` and ``quota_exceeded`` pass through
as themselves (``FILE_HELPER``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from orchestrator.errors import BackendError
from orchestrator.session.helper_exchange import Helper
from orchestrator.session.paths import MAX_PATH_CHARS
from orchestrator.session.repl.protocol import MAX_COUNT

__all__ = [
    "FILE_HELPER",
    "MAX_LIST_ENTRIES",
    "ArchiveReply",
    "CheckReply",
    "ContentReply",
    "EntryReply",
    "EntryType",
    "ExistsReply",
    "ExtractReply",
    "FileReply",
    "ListReply",
    "M",
    "MakeDirReply",
    "RemoveReply",
    "RenameReply",
    "WriteReply",
    "b64_len",
    "helper_b64",
]

FILE_HELPER = Helper("file helper")
MAX_LIST_ENTRIES = 2000
# A file's metadata (its ``user.e2b.*`` extended attributes): as many keys, as long, as the
# helper sends at most (``worker/fileops.py``).
MAX_METADATA_KEYS = 32
MAX_METADATA_CHARS = 1024
MetadataText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_METADATA_CHARS)]

EntryType = Literal["file", "dir", "symlink", "other"]
M = TypeVar("M", bound=BaseModel)


class FileReply(BaseModel):
    # Fields this side does not use are dropped, never trusted; types are not coerced.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class WriteReply(FileReply):
    size: int = Field(ge=0, le=MAX_COUNT)
    created: bool


class ContentReply(FileReply):
    content_b64: str


class ArchiveReply(FileReply):
    archive_b64: str


class EntryReply(FileReply):
    name: str = Field(min_length=1, max_length=255)
    type: EntryType
    size: int = Field(ge=0, le=MAX_COUNT)
    mode: int = Field(ge=0, le=0o7777)
    mtime: float = Field(allow_inf_nan=False)
    link_target: str | None = Field(default=None, max_length=256)
    metadata: dict[MetadataText, Annotated[str, Field(max_length=MAX_METADATA_CHARS)]] | None = (
        Field(default=None, max_length=MAX_METADATA_KEYS)
    )

    def entry(self) -> dict[str, Any]:
        return {**self.model_dump(), "mode": f"{self.mode:04o}"}


class ListReply(FileReply):
    entries: list[EntryReply] = Field(max_length=MAX_LIST_ENTRIES)
    truncated: bool


class CheckReply(FileReply):
    real_path: str = Field(max_length=MAX_PATH_CHARS)
    exists: bool
    type: EntryType | None


class ExistsReply(FileReply):
    exists: bool
    type: EntryType | None


class RemoveReply(FileReply):
    type: EntryType


class RenameReply(FileReply):
    replaced: bool


class MakeDirReply(FileReply):
    created: bool


class ExtractReply(FileReply):
    entries: int = Field(ge=0, le=MAX_COUNT)
    size: int = Field(ge=0, le=MAX_COUNT)


def helper_b64(value: str, limit: int) -> bytes:
    """Base64 bytes from the helper, at most ``limit`` of them."""
    if len(value) > b64_len(limit):
        raise BackendError(f"the file helper sent more than {limit} bytes")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BackendError("the file helper sent invalid base64") from None


def b64_len(size: int) -> int:
    """The length of the base64 of ``size`` bytes."""
    return (size + 2) // 3 * 4
