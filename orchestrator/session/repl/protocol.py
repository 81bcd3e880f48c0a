"""The worker protocol as the orchestrator reads it: newline-delimited JSON whose every frame is
untrusted. Lines are bounded in size, decoded strictly (``untrusted_json``: no NaN or Infinity,
integers of a bounded number of digits) and checked against these models, every number in them
bounded; anything else is a ``ProtocolViolation``, which ends that worker and nothing else. The
file and process helpers' replies are decoded by ``untrusted_json`` too.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Annotated, Any, Final, Literal, TypeVar

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from orchestrator.errors import ERROR_TYPES

__all__ = [
    "BINARY_MIME_TYPES",
    "MAX_COUNT",
    "MAX_INT_DIGITS",
    "MAX_RESULTS",
    "MIME_TYPES",
    "PROTOCOL_VERSION",
    "WORKER_ERROR_TYPES",
    "ExecuteReply",
    "FatalFrame",
    "InspectReply",
    "LineBuffer",
    "ListVariablesReply",
    "PreloadReply",
    "ProtocolViolation",
    "ReadyFrame",
    "Reply",
    "StreamFrame",
    "decode_frame",
    "encode_request",
    "payload",
    "untrusted_json",
]

M = TypeVar("M", bound=BaseModel)

PROTOCOL_VERSION = 1
# Request ids are ours; a reply with any other id is a lie or a leftover.
MAX_ID_CHARS = 64
# The error types of ours a worker reports for a cell; it names a user exception class that
# shares a name with any other under a qualified name (worker/executor.py), so a reply naming
# one of the others (timeout, process_crashed, ...) is a forgery posing as the host.
WORKER_ERROR_TYPES: Final = frozenset({"validation", "import_blocked"})
# An integer of more digits is refused before Python converts it (which it refuses past 4300
# digits, with a ValueError): nothing a container reports comes near 2**63.
MAX_INT_DIGITS: Final = 19
MAX_COUNT: Final = 2**63 - 1
# Times in ms and memory in MiB: a thousand years of a cell, a zettabyte; past that it is a lie.
MAX_MEASURE: Final = 1e13

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Measure = Annotated[float, Field(ge=0, le=MAX_MEASURE, allow_inf_nan=False)]


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} characters")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 is valid JSON and parses as inf
        raise ValueError(f"a number out of range: {text[:32]}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def untrusted_json(data: bytes | str) -> Any:
    """JSON from a container, strictly: a ``ValueError`` for anything else, for NaN, Infinity,
    a float out of range, an integer over ``MAX_INT_DIGITS`` digits, or nesting too deep."""
    try:
        return json.loads(
            data,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_no_constant,
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None


class ProtocolViolation(Exception):
    """The worker sent something the protocol does not allow."""


class _Frame(BaseModel):
    # Replies may carry fields this side does not use; they are dropped, never trusted.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ReadyFrame(_Frame):
    type: Literal["ready"]
    pid: int = Field(gt=1, lt=2**22)
    protocol: int = Field(ge=0, le=2**31)
    python: str = Field(max_length=64)


class FatalFrame(_Frame):
    type: Literal["fatal"]
    error_message: str = Field(max_length=4096)


class StreamFrame(_Frame):
    """Output of a streaming request while it runs; the reply still carries all of it."""

    type: Literal["stream"]
    id: str = Field(max_length=MAX_ID_CHARS)
    name: Literal["stdout", "stderr"]
    # One read of a capture pipe (64 KiB) decoded; escaping does not count here.
    text: str = Field(max_length=1 << 17)


class Reply(_Frame):
    """Any reply. Its operation-specific payload stays in ``raw`` for the typed models below."""

    type: Literal["reply"]
    id: str | None = Field(max_length=MAX_ID_CHARS)
    ok: bool
    error_type: str | None = Field(default=None, max_length=64)
    error_message: str | None = None
    raw: dict[str, Any] = Field(default_factory=dict, exclude=True)


# What a rich result may carry (worker/display.py makes them); binary types travel as base64.
MIME_TYPES: Final = (
    "text/plain",
    "text/html",
    "text/markdown",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "text/latex",
    "application/json",
    # A table's columns as lists (a DataFrame's): E2B's ``data``.
    "application/vnd.sandhold.data+json",
)
JSON_MIME_TYPES: Final = frozenset({"application/json", "application/vnd.sandhold.data+json"})
BINARY_MIME_TYPES: Final = frozenset({"image/png", "image/jpeg"})
RESULT_FLAGS: Final = frozenset({"is_main_result", "truncated"})
MAX_RESULTS: Final = 100


def checked_bundle(value: Any) -> dict[str, Any]:
    """One rich result from a worker, refused unless it is exactly what a bundle may hold."""
    if not isinstance(value, dict):
        raise ValueError("a result is not an object")
    unknown = value.keys() - set(MIME_TYPES) - RESULT_FLAGS
    if unknown:
        raise ValueError(f"a result names unknown fields {sorted(unknown)[:4]}")
    if not isinstance(value.get("text/plain"), str):
        raise ValueError("a result has no text/plain")
    for flag in RESULT_FLAGS & value.keys():
        if type(value[flag]) is not bool:
            raise ValueError(f"a result's {flag} is not a boolean")
    for mime in set(MIME_TYPES) & value.keys():
        data = value[mime]
        if mime in JSON_MIME_TYPES:
            if not isinstance(data, dict | list):
                raise ValueError(f"a result's {mime} is not an object or array")
        elif not isinstance(data, str):
            raise ValueError(f"a result's {mime} is not a string")
        elif mime in BINARY_MIME_TYPES:
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"a result's {mime} is not base64") from None
    return value


def bundle_size(bundle: dict[str, Any]) -> int:
    """Bytes a bundle's representations take, as the worker's budget counts them."""
    return sum(
        len(json.dumps(data)) if not isinstance(data, str) else len(data.encode("utf-8", "replace"))
        for mime, data in bundle.items()
        if mime not in RESULT_FLAGS
    )


Bundle = Annotated[dict[str, Any], AfterValidator(checked_bundle)]


class ExecuteReply(_Frame):
    success: bool
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: Count = 0
    stderr_bytes: Count = 0
    result_repr: str | None = None
    results: list[Bundle] = Field(default_factory=list, max_length=MAX_RESULTS)
    results_dropped: Count = 0
    error_type: str | None = Field(default=None, max_length=128)
    error_message: str | None = None
    traceback: str | None = None
    violations: list[str] = Field(default_factory=list, max_length=1000)
    execution_time_ms: Measure
    cpu_time_ms: Measure
    peak_memory_mb: Measure
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


class PreloadReply(_Frame):
    """Which modules a ``preload`` imported, and each it left out with the reason."""

    loaded: list[Annotated[str, Field(max_length=256)]] = Field(max_length=64)
    skipped: list[Annotated[str, Field(max_length=1024)]] = Field(max_length=64)


class InspectReply(_Frame):
    found: bool
    name: str = Field(max_length=256)
    # On the wire ``type`` names the frame, so the variable's type travels as ``type_name``.
    type: str | None = Field(default=None, max_length=256, validation_alias="type_name")
    repr: str | None = None
    length: Count | None = None
    doc: str | None = None
    signature: str | None = None
    shape: Annotated[list[Count], Field(max_length=64)] | str | None = None
    dtype: str | None = None


class LineBuffer:
    """Assembles lines from stream chunks; refuses any line longer than ``max_line`` bytes."""

    def __init__(self, max_line: int) -> None:
        self._max_line = max_line
        self._pending = bytearray()
        # How much of the pending line is known to hold no newline: a line of many MiB arrives
        # in 32 KiB chunks, and searching it whole for each would cost quadratic time.
        self._scanned = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        lines = []
        start = self._scanned
        while (end := self._pending.find(b"\n", start)) >= 0:
            lines.append(bytes(self._pending[:end]))
            del self._pending[: end + 1]
            start = 0
        self._scanned = len(self._pending)
        if len(self._pending) > self._max_line or any(len(x) > self._max_line for x in lines):
            raise ProtocolViolation(f"a frame is longer than {self._max_line} bytes")
        return lines


def decode_frame(line: bytes) -> ReadyFrame | FatalFrame | StreamFrame | Reply:
    try:
        data = untrusted_json(line)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise ProtocolViolation(f"a frame is not JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise ProtocolViolation("a frame is not a JSON object")
    kind = data.get("type")
    model: type[ReadyFrame | FatalFrame | StreamFrame | Reply]
    if kind == "ready":
        model = ReadyFrame
    elif kind == "fatal":
        model = FatalFrame
    elif kind == "reply":
        model = Reply
    elif kind == "stream":
        model = StreamFrame
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
