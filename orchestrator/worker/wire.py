"""The wire format: newline-delimited JSON, UTF-8, one object per line. Requests are read with a
bound on the line length and checked against a fixed schema; replies are encoded so that a line
never exceeds the reply limit, shrinking the largest fields and saying so with ``truncated``.

The JSON encoder and decoder are bound at import, before any user code runs, so restricted code
cannot change how the worker talks even where it can touch the json module."""

import json
import os
from typing import Any, BinaryIO, NamedTuple

MAX_ID_CHARS = 64
# Arguments of each operation and their types; anything else is refused.
OPS: dict[str, dict[str, type]] = {
    "execute": {"code": str},
    "list_variables": {},
    "inspect": {"name": str},
    "reset": {},
    "ping": {},
    "preload": {"modules": list},
    "set_env": {"env": dict},
    "shutdown": {},
}
# Arguments an operation may be given besides those: streaming output as it comes, and
# environment variables for that request only.
OPTIONAL: dict[str, dict[str, type]] = {"execute": {"stream": bool, "env": dict}}
# Fields cut (string halved, list shortened) when a reply is too large, most expendable first.
_SHRINKABLE = (
    "stdout",
    "stderr",
    "traceback",
    "results",
    "result_repr",
    "repr",
    "error_message",
    "violations",
    "variables",
    "modules",
    "doc",
    "signature",
)
_MAX_SHRINK_ROUNDS = 64
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_encode_ascii = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_decode = json.JSONDecoder().decode


# A NamedTuple, not a dataclass: the file helper reads its lines with LineReader, and
# dataclasses would cost it ~15 ms of imports at each start and ~1.5 MiB while it lives.
class Request(NamedTuple):
    id: str
    op: str
    args: dict[str, Any]


class BadRequest(Exception):
    """A line the worker cannot understand; answered with ``invalid_argument``."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class LineReader:
    """Lines from the protocol input, each at most ``limit`` bytes."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        # closefd=False: the fd may also carry replies (a socket); the owner closes it.
        self._file: BinaryIO = os.fdopen(fd, "rb", buffering=1 << 16, closefd=False)
        self._limit = limit

    def close(self) -> None:
        self._file.close()
        os.close(self.fd)

    def read_line(self) -> bytes | None:
        """The next line; None at EOF. Raises BadRequest for an over-long line, discarded."""
        line = self._file.readline(self._limit)
        if len(line) < self._limit or line.endswith(b"\n"):
            return line or None
        while line and not line.endswith(b"\n"):
            line = self._file.readline(1 << 16)
        raise BadRequest(f"request line longer than {self._limit} bytes")


def parse_request(line: bytes) -> Request:
    try:
        raw = _decode(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"request is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(raw, dict):
        raise BadRequest("request must be a JSON object")
    request_id = raw.get("id")
    if not _valid_id(request_id):
        raise BadRequest(f"request id must be a string of 1..{MAX_ID_CHARS} characters")
    assert isinstance(request_id, str)
    op = raw.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise BadRequest(f"unknown op {str(op)[:64]!r}; known: {sorted(OPS)}", request_id)
    required, optional = OPS[op], OPTIONAL.get(op, {})
    args = {key: value for key, value in raw.items() if key not in ("id", "op")}
    if not required.keys() <= args.keys() <= required.keys() | optional.keys():
        expected = sorted(required) or "no arguments"
        raise BadRequest(f"op '{op}' takes {expected}, got {sorted(args)[:16]}", request_id)
    for key, kind in (required | optional).items():
        if key in args and type(args[key]) is not kind:
            raise BadRequest(f"'{key}' must be a {kind.__name__}", request_id)
    env = args.get("env")
    if env is not None and not all(
        type(name) is str
        and type(value) is str
        and name
        and "=" not in name
        and "\0" not in name
        and "\0" not in value
        for name, value in env.items()
    ):
        raise BadRequest("'env' must map names to strings", request_id)
    return Request(request_id, op, args)


def _valid_id(value: object) -> bool:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dump(message: dict[str, Any]) -> bytes:
    """One JSON line. Lone surrogates (a user ``__repr__`` may return them) force ASCII escapes."""
    text = _encode(message)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return _encode_ascii(message).encode("ascii") + b"\n"


def encode_reply(reply: dict[str, Any], limit: int) -> bytes:
    """``reply`` as one line of at most ``limit`` bytes, shrunk and flagged if need be."""
    line = dump(reply)
    if len(line) <= limit:
        return line
    reply = dict(reply, truncated=True)
    for _ in range(_MAX_SHRINK_ROUNDS):
        present = [key for key in _SHRINKABLE if reply.get(key)]
        if not present:
            break
        key = max(present, key=lambda name: _size(reply[name]))
        reply[key] = _halve(reply[key])
        line = dump(reply)
        if len(line) <= limit:
            return line
    fallback = {
        "type": "reply",
        "id": reply.get("id"),
        "ok": False,
        "error_type": "internal",
        "error_message": "reply could not be cut down to the reply size limit",
    }
    return dump(fallback)


def _size(value: object) -> int:
    return len(value) if isinstance(value, str) else len(dump({"v": value}))


def _halve(value: Any) -> Any:
    if isinstance(value, str):
        keep = len(value) // 2
        return value[:keep] + "... [truncated]" if keep > 32 else ""
    if isinstance(value, list):
        return value[: len(value) // 2]
    return None


def write_line(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
