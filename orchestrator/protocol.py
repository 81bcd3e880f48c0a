"""The worker protocol as the orchestrator reads it: newline-delimited JSON whose every frame is
untrusted. Lines are bounded in size, decoded strictly and checked against these models; anything
else is a ``ProtocolViolation``, which ends that worker and nothing else.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.errors import ERROR_TYPES

M = TypeVar("M", bound=BaseModel)

PROTOCOL_VERSION = 1
# Request ids are ours; a reply with any other id is a lie or a leftover.
MAX_ID_CHARS = 64
# The error types of ours a worker reports for a cell; it names a user exception class that
# shares a name with any other under a qualified name (worker/executor.py), so a reply naming
# one of the others (timeout, process_crashed, ...) is a forgery posing as the host.
WORKER_ERROR_TYPES: Final = frozenset({"validation", "import_blocked"})


class ProtocolViolation(Exception):
    """The worker sent something the protocol does not allow."""


class _Frame(BaseModel):
    # Replies may carry fields this side does not use; they are dropped, never trusted.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ReadyFrame(_Frame):
    type: Literal["ready"]
    pid: int = Field(gt=1, lt=2**22)
    protocol: int
    python: str = Field(max_length=64)


class FatalFrame(_Frame):
    type: Literal["fatal"]
    error_message: str = Field(max_length=4096)


class Reply(_Frame):
    """Any reply. Its operation-specific payload stays in ``raw`` for the typed models below."""

    type: Literal["reply"]
    id: str | None = Field(max_length=MAX_ID_CHARS)
    ok: bool
    error_type: str | None = Field(default=None, max_length=64)
    error_message: str | None = None
    raw: dict[str, Any] = Field(default_factory=dict, exclude=True)


class ExecuteReply(_Frame):
    success: bool
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = Field(default=0, ge=0)
    stderr_bytes: int = Field(default=0, ge=0)
    result_repr: str | None = None
    error_type: str | None = Field(default=None, max_length=128)
    error_message: str | None = None
    traceback: str | None = None
    violations: list[str] = Field(default_factory=list, max_length=1000)
    execution_time_ms: float = Field(ge=0)
    cpu_time_ms: float = Field(ge=0)
    peak_memory_mb: float = Field(ge=0)
    truncated: bool = False
    interrupted: bool = False

    @field_validator("error_type")
    @classmethod
    def _not_the_hosts(cls, value: str | None) -> str | None:
        if value in ERROR_TYPES and value not in WORKER_ERROR_TYPES:
            raise ValueError(f"{value!r} is an error type only the host gives")
        return value


class VariableInfo(_Frame):
    name: str = Field(max_length=256)
    type: str = Field(max_length=256)


class ListVariablesReply(_Frame):
    variables: list[VariableInfo] = Field(max_length=100_000)
    modules: list[str] = Field(default_factory=list, max_length=10_000)


class InspectReply(_Frame):
    found: bool
    name: str = Field(max_length=256)
    # On the wire ``type`` names the frame, so the variable's type travels as ``type_name``.
    type: str | None = Field(default=None, max_length=256, validation_alias="type_name")
    repr: str | None = None
    length: int | None = None
    doc: str | None = None
    signature: str | None = None
    shape: list[int] | str | None = None
    dtype: str | None = None


class LineBuffer:
    """Assembles lines from stream chunks; refuses any line longer than ``max_line`` bytes."""

    def __init__(self, max_line: int) -> None:
        self._max_line = max_line
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        lines = []
        while (end := self._pending.find(b"\n")) >= 0:
            lines.append(bytes(self._pending[:end]))
            del self._pending[: end + 1]
        if len(self._pending) > self._max_line or any(len(x) > self._max_line for x in lines):
            raise ProtocolViolation(f"a frame is longer than {self._max_line} bytes")
        return lines


def decode_frame(line: bytes) -> ReadyFrame | FatalFrame | Reply:
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolViolation(f"a frame is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolViolation("a frame is not a JSON object")
    kind = data.get("type")
    model: type[ReadyFrame | FatalFrame | Reply]
    if kind == "ready":
        model = ReadyFrame
    elif kind == "fatal":
        model = FatalFrame
    elif kind == "reply":
        model = Reply
    else:
        raise ProtocolViolation(f"unknown frame type {str(kind)[:32]!r}")
    data.pop("raw", None)
    frame = _validated(model, data)
    if isinstance(frame, Reply):
        frame = frame.model_copy(update={"raw": data})
    return frame


def payload(reply: Reply, model: type[M]) -> M:
    """The operation-specific fields of a reply, checked against ``model``."""
    return _validated(model, reply.raw)


def _validated(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolViolation(f"{model.__name__}.{where}: {first['msg']}") from None


def encode_request(request_id: str, op: str, **args: Any) -> bytes:
    return json.dumps({"id": request_id, "op": op, **args}, separators=(",", ":")).encode() + b"\n"
