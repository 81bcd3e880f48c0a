"""``sandhold mcp`` answers the MCP ``initialize`` handshake before it imports the MCP SDK, whose
import alone takes about 0.45 s here: a client that spawns the server sees it ready at once,
and its next request (``tools/list``) waits for the SDK instead. Standard library only.

The first frame on stdin is read; when it is an ``initialize`` request for a protocol version
in ``EARLY_VERSIONS``, the answer the SDK would give is written at once (the same fields, kept
equal to the SDK's by tests/unit/test_mcp_handshake.py), and the request is then handed to the
SDK as if unread, so its session is initialised as usual; the SDK's own answer to that request
id is dropped (``EarlyAnswer.request_id``). Anything else (``server/discover``, another version,
a frame that is not plain JSON) is handed to the SDK untouched, which answers it itself.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EARLY_VERSIONS",
    "INSTRUCTIONS",
    "SERVER_NAME",
    "EarlyAnswer",
    "answer_initialize_early",
    "initialize_reply",
    "server_version",
]

SERVER_NAME = "sandhold"
INSTRUCTIONS = (
    "Hardened sandbox sessions, each its own container. Create one with python_repl execute, "
    "terminal run or terminal start without session_id; the answer carries the session_id to pass "
    "to every later call (files and process need it). End it with python_repl destroy. Every "
    "result is structured content with `success`, and `error_type`/`error_message` on failure."
)
# The handshake versions answered here (the SDK echoes a version it supports); any other is the
# SDK's to negotiate.
EARLY_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
# A first read asks for this much; an initialize frame is a few hundred bytes.
READ_CHUNK_BYTES = 1 << 16
# A first frame longer than this is no plain initialize: it is handed on unread past here.
MAX_FIRST_FRAME_BYTES = 1 << 20


@dataclass(frozen=True)
class EarlyAnswer:
    """What the early step did: the bytes it read from stdin (the SDK must read them again) and
    the id of the request it answered (None when it answered nothing)."""

    consumed: bytes = b""
    request_id: int | str | None = None


def server_version() -> str:
    """The version of sandhold installed, as servers announce it."""
    try:
        return importlib.metadata.version("sandhold")
    except importlib.metadata.PackageNotFoundError:
        return ""


def answer_initialize_early(*, fd_in: int = 0, fd_out: int = 1) -> EarlyAnswer:
    """Read the first frame from ``fd_in`` and answer it on ``fd_out`` if it is an initialize
    this module can answer. Blocks until a line (or EOF) arrives, as serving would."""
    consumed = _first_line(fd_in)
    line = consumed.split(b"\n", 1)[0]
    reply = initialize_reply(line, version=server_version())
    if reply is None:
        return EarlyAnswer(consumed)
    request_id, frame = reply
    view = memoryview(frame)
    while view:
        view = view[os.write(fd_out, view) :]
    return EarlyAnswer(consumed, request_id)


def initialize_reply(line: bytes, *, version: str) -> tuple[int | str, bytes] | None:
    """The id and answer frame of an ``initialize`` request line, or None for any other line."""
    try:
        message: Any = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None
    request_id, params = message.get("id"), message.get("params")
    if (
        message.get("method") != "initialize"
        or isinstance(request_id, bool)
        or not isinstance(request_id, int | str)
        or not isinstance(params, dict)
        or params.get("protocolVersion") not in EARLY_VERSIONS
    ):
        return None
    result = {
        "capabilities": {"tools": {"listChanged": False}},
        "instructions": INSTRUCTIONS,
        "protocolVersion": params["protocolVersion"],
        "serverInfo": {"name": SERVER_NAME, "version": version},
    }
    frame = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return request_id, (json.dumps(frame, separators=(",", ":")) + "\n").encode()


def _first_line(fd: int) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < MAX_FIRST_FRAME_BYTES:
        chunk = os.read(fd, READ_CHUNK_BYTES)
        if not chunk:
            break
        data += chunk
    return data
