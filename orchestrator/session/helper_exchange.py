"""One run of an in-container helper (``worker/fileops.py``, ``worker/procs.py``): one JSON
request on its stdin, one JSON reply on its stdout: ``{"ok": true, ...}`` or ``{"ok": false,
"error_type", "error_message", ...}``. A served helper (``served_helper``) answers many requests
over one stream; its replies are judged here too (``reply_payload``), by the same rules.

Invariants: the request is written while the reply is read, so neither side can block the other;
stdout is bounded, stderr keeps only its tail (for diagnostics); the whole run is bounded by its
timeout and the exec stream is closed on every path, shielded. Everything the helper says is
untrusted: the reply is strictly decoded (``protocol.untrusted_json``) and checked against a model
(``parse_reply``); anything else is a ``BackendError``, never a crash. Only the refusals a helper
names in ``Helper.refusals`` pass through as errors of their own.

A helper that does not answer within its bound is a ``BackendError`` (``internal``): the call
itself failed, for a reason of the sandbox (a frozen container, a stuck engine), not of the
caller's arguments or code. ``timeout`` is not used for it: in the tool contract that reports
what the caller's own work did (a cell or a command past the timeout it was given).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backend.base import STDERR, Backend, ExecSpec, ExecStream
from orchestrator.errors import (
    BackendError,
    InvalidArgumentError,
    OrchestratorError,
    PathNotFoundError,
    QuotaExceededError,
)
from orchestrator.session.repl.protocol import untrusted_json

__all__ = [
    "Helper",
    "HelperFailure",
    "Refusal",
    "call_helper",
    "parse_reply",
    "reply_payload",
    "stderr_hint",
]

M = TypeVar("M", bound=BaseModel)

STDERR_TAIL_BYTES = 2048
# What one send hands the engine's socket: a large upload is not one multi-megabyte write.
SEND_CHUNK_BYTES = 256 * 1024
# A helper's own refusal is shown to the caller; longer messages are cut, not trusted whole.
MAX_MESSAGE_CHARS = 4096
# What of the helper's stderr goes into the error when its reply is unreadable.
STDERR_SHOWN_CHARS = 500


class HelperFailure(BaseModel):
    """A helper's ``{"ok": false}`` reply; ``running`` is the process helper's count at a quota."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    error_type: str = Field(max_length=64)
    error_message: str
    running: int | None = Field(default=None, ge=0, le=100_000)


# Makes the error a refusal of the helper's own stands for.
Refusal = Callable[[HelperFailure], OrchestratorError]


def _default_refusals() -> dict[str, Refusal]:
    return {
        "invalid_argument": lambda failure: InvalidArgumentError(failure.error_message),
        "quota_exceeded": lambda failure: QuotaExceededError(failure.error_message),
        "path_not_found": lambda failure: PathNotFoundError(failure.error_message),
    }


@dataclass(frozen=True)
class Helper:
    """One helper program: its name in messages, and the failures of its own that pass through
    as our errors (every other ``error_type`` it names is a ``BackendError``)."""

    name: str
    refusals: Mapping[str, Refusal] = field(default_factory=_default_refusals)


async def call_helper(
    backend: Backend,
    container_id: str,
    helper: Helper,
    argv: Sequence[str],
    request: Mapping[str, Any],
    *,
    max_reply_bytes: int,
    timeout: float,
) -> dict[str, Any]:
    """Run ``argv`` (the helper and its operation, named last) with ``request`` on its stdin;
    the payload of its successful reply, or the error its refusal stands for."""
    op = argv[-1]
    payload = json.dumps(request).encode()
    stream = await backend.open_exec(container_id, ExecSpec(argv=list(argv)))
    try:
        stdout, stderr = await _exchange(stream, payload, helper, op, max_reply_bytes, timeout)
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
    return _payload(helper, op, stdout, stderr)


def parse_reply(helper: Helper, op: str, model: type[M], data: Any) -> M:
    """``data`` (a reply's payload) as ``model``, or a ``BackendError`` naming the first fault."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "-"
        raise BackendError(
            f"the {helper.name} sent a malformed {op} reply ({where}: {first['msg']})"
        ) from None


async def _exchange(
    stream: ExecStream, payload: bytes, helper: Helper, op: str, limit: int, timeout: float
) -> tuple[bytes, bytes]:
    async def feed() -> None:
        try:
            for start in range(0, len(payload), SEND_CHUNK_BYTES):
                await stream.send(payload[start : start + SEND_CHUNK_BYTES])
            await stream.send_eof()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the helper stopped reading; its reply (or its absence) tells why

    # Errors are carried out of the task group by hand so they are not wrapped in a group.
    outcome: tuple[bytes, bytes] | OrchestratorError | None = None
    with anyio.move_on_after(timeout):
        async with anyio.create_task_group() as group:
            group.start_soon(feed)
            try:
                outcome = await _collect(stream, helper, op, limit)
            except OrchestratorError as exc:
                outcome = exc
            group.cancel_scope.cancel()
    if outcome is None:
        raise BackendError(f"the {helper.name} did not answer {op} within {timeout:g} s")
    if isinstance(outcome, OrchestratorError):
        raise outcome
    return outcome


async def _collect(stream: ExecStream, helper: Helper, op: str, limit: int) -> tuple[bytes, bytes]:
    out, err = bytearray(), b""
    while (chunk := await stream.receive()) is not None:
        stream_no, data = chunk
        if stream_no == STDERR:
            err = (err + data)[-STDERR_TAIL_BYTES:]
            continue
        out += data
        if len(out) > limit:
            raise BackendError(f"the {helper.name}'s {op} reply is over {limit} bytes")
    return bytes(out), err


def _payload(helper: Helper, op: str, stdout: bytes, stderr: bytes) -> dict[str, Any]:
    try:
        reply = untrusted_json(stdout)
    except ValueError:
        raise BackendError(
            f"the {helper.name} sent no valid reply to {op}", hint=stderr_hint(stderr)
        ) from None
    return reply_payload(helper, op, reply)


def stderr_hint(stderr: bytes) -> str | None:
    """What of a helper's stderr tail goes into an error about its reply."""
    return stderr.decode("utf-8", "replace").strip()[-STDERR_SHOWN_CHARS:] or None


def reply_payload(helper: Helper, op: str, reply: Any) -> dict[str, Any]:
    """The payload of a decoded reply ``{"ok": true, ...}``, or the error its ``{"ok": false}``
    stands for (a ``BackendError`` unless it is one of the helper's refusals)."""
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise BackendError(f"the {helper.name}'s {op} reply has no ok flag")
    if reply.pop("ok"):
        return reply
    failure = parse_reply(helper, op, HelperFailure, reply)
    failure = failure.model_copy(
        update={"error_message": failure.error_message[:MAX_MESSAGE_CHARS]}
    )
    refusal = helper.refusals.get(failure.error_type)
    if refusal is None:
        raise BackendError(f"the {helper.name} failed {op}: {failure.error_message}")
    raise refusal(failure)
