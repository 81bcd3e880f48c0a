"""The wire protocol of the in-container file helper (``worker/fileops.py``), host side: one JSON
request on its stdin, one JSON reply on its stdout, per run.

Everything the helper says is untrusted: its reply is size-bounded, strictly decoded (numbers
bounded, ``protocol.untrusted_json``) and checked against the reply models below (unused fields
dropped, types never coerced); anything else is a ``BackendError``, never a crash. Only the
helper's own ``invalid_argument`` and ``quota_exceeded`` pass through as themselves.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal, TypeVar

import anyio
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backend.base import STDERR, ExecStream
from orchestrator.errors import (
    BackendError,
    ExecutionTimeoutError,
    InvalidArgumentError,
    OrchestratorError,
    QuotaExceededError,
)
from orchestrator.session.paths import MAX_PATH_CHARS
from orchestrator.session.repl.protocol import MAX_COUNT, untrusted_json

__all__ = [
    "MAX_LIST_ENTRIES",
    "ArchiveReply",
    "CheckReply",
    "ContentReply",
    "EntryReply",
    "EntryType",
    "ExtractReply",
    "ListReply",
    "M",
    "WriteReply",
    "b64_len",
    "exchange",
    "helper_b64",
    "parse_reply",
]

# One docker exec (~60 ms) plus moving at most max_file_bytes over a local socket; a minute
# means the engine or the container is stuck.
OP_TIMEOUT = 60.0
MAX_LIST_ENTRIES = 2000
MAX_MESSAGE_CHARS = 4096
STDERR_TAIL_BYTES = 2048
SEND_CHUNK_BYTES = 256 * 1024

EntryType = Literal["file", "dir", "symlink", "other"]
M = TypeVar("M", bound=BaseModel)


class Reply(BaseModel):
    # Fields this side does not use are dropped, never trusted; types are not coerced.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class WriteReply(Reply):
    size: int = Field(ge=0, le=MAX_COUNT)
    created: bool


class ContentReply(Reply):
    content_b64: str


class ArchiveReply(Reply):
    archive_b64: str


class EntryReply(Reply):
    name: str = Field(min_length=1, max_length=255)
    type: EntryType
    size: int = Field(ge=0, le=MAX_COUNT)
    mode: int = Field(ge=0, le=0o7777)
    mtime: float = Field(allow_inf_nan=False)
    link_target: str | None = Field(default=None, max_length=256)

    def entry(self) -> dict[str, Any]:
        return {**self.model_dump(), "mode": f"{self.mode:04o}"}


class ListReply(Reply):
    entries: list[EntryReply] = Field(max_length=MAX_LIST_ENTRIES)
    truncated: bool


class CheckReply(Reply):
    real_path: str = Field(max_length=MAX_PATH_CHARS)
    exists: bool
    type: EntryType | None


class ExtractReply(Reply):
    entries: int = Field(ge=0, le=MAX_COUNT)
    size: int = Field(ge=0, le=MAX_COUNT)


_HELPER_ERRORS: dict[str, type[OrchestratorError]] = {
    "invalid_argument": InvalidArgumentError,
    "quota_exceeded": QuotaExceededError,
}


async def exchange(stream: ExecStream, payload: bytes, limit: int) -> tuple[bytes, bytes]:
    """Send the request while reading the reply, so neither side can block the other: stdout
    up to ``limit`` bytes, and the tail of stderr for diagnostics."""

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


def parse_reply(op: str, stdout: bytes, stderr: bytes, model: type[M]) -> M:
    """The helper's reply to ``op`` as ``model``; its own refusal raised as our error."""
    reply = _decode_reply(stdout, stderr)
    try:
        return model.model_validate(reply)
    except pydantic.ValidationError as exc:
        raise BackendError(
            f"the file helper's {op} reply is malformed: {str(exc)[:1000]}"
        ) from None


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


async def _collect(stream: ExecStream, limit: int) -> tuple[bytes, bytes]:
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


def _decode_reply(stdout: bytes, stderr: bytes) -> dict[str, Any]:
    try:
        reply = untrusted_json(stdout)
    except ValueError:
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
