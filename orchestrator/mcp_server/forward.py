"""``sandhold mcp --connect URL``: MCP on stdio in front of a running ``sandhold serve``. Every
request line from the client is POSTed to the server's ``/mcp`` endpoint with an API key, and every
JSON-RPC message of its answer (progress notifications, then the result or error) is written back
unchanged; sessions live in the server, so they outlive the stdio process. This is the set-up for
clients that start a server per call (langchain-mcp-adapters' ``get_tools()``), so a process must
cost little: standard library only, no MCP SDK, no event loop (issue 32: the SDK's import alone
made a call cost ~0.7 s; bench/mcp_connect.py measures it). The connection, its waits and the
event reader are ``orchestrator.client``'s, which every client of ``serve`` shares and which is
standard library only too.

Public API:

- ``RemoteSandhold(url, *, key, task=None)``: one blocking ``post(message, on_message, call)``
  per request, on a connection of its own that ``call.abort()`` (a ``Call``) closes from another
  thread.
- ``serve_stdio_forwarding(remote, *, early=None)``: serve one stdio client until EOF.
- ``mcp_endpoint(url)``: ``http://host:port`` (or ``.../mcp``) as the endpoint URL.

What is answered here rather than forwarded: ``initialize`` for the versions
``mcp_server.handshake`` answers (the first one before this module was even imported; a client
whose ``server/discover`` the server refused falls back to one), ``ping``, and the client's
notifications: ``notifications/cancelled`` aborts the named request's connection (the server
cancels the call, which interrupts its cell with state kept); the rest mean nothing to a stateless
endpoint. A request the server cannot be reached for answers ``backend_unavailable`` (a
``tools/call``, as a tool result with ``isError``) or a JSON-RPC internal error (anything else), so
the front keeps serving while the server restarts.

Invariants: one thread reads stdin; each request is served in a thread of its own, so a long
cell never holds up a listing or a cancel; every write to stdout is one whole line under one
lock, and none is made once stdin has ended (the client has closed its side and may already be
gone: an answer written then is one it can no longer take). At EOF every request still in flight
is aborted and the process ends without waiting for them.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.client import (
    MAX_ANSWER_BYTES,
    TASK_HEADER,
    EventDecoder,
    answer_timeout,
    checked_url,
    failure,
    posted,
)
from orchestrator.mcp_server.handshake import EarlyAnswer, initialize_reply, server_version

__all__ = ["Call", "RemoteSandhold", "mcp_endpoint", "serve_stdio_forwarding"]

# Stdin is read in chunks of this size; frames are split on newlines.
STDIN_CHUNK_BYTES = 1 << 16
# The protocol version sent before a client has named one (any version the server speaks).
DEFAULT_PROTOCOL_VERSION = "2025-06-18"
INTERNAL_ERROR = -32603
PARSE_ERROR = -32700


def mcp_endpoint(url: str) -> str:
    """The MCP endpoint of the server at ``url`` (``http(s)://host:port``, optionally ``/mcp``)."""
    parts = urllib.parse.urlsplit(checked_url(url, name="--connect"))
    path = parts.path.rstrip("/")
    if not path.endswith("/mcp"):
        path += "/mcp"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _arguments(message: dict[str, Any]) -> object:
    """The tool arguments of a ``tools/call`` request (None for any other message)."""
    params = message.get("params")
    return params.get("arguments") if isinstance(params, dict) else None


class RemoteSandhold:
    """The ``/mcp`` endpoint of the ``sandhold serve`` at ``url``, called with ``key`` (and
    ``task``, if any)."""

    def __init__(self, url: str, *, key: str, task: str | None = None) -> None:
        self.endpoint = mcp_endpoint(url)
        self._headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if task:
            self._headers[TASK_HEADER] = task
        self.protocol_version = DEFAULT_PROTOCOL_VERSION

    def post(
        self,
        message: dict[str, Any],
        on_message: Callable[[dict[str, Any]], None],
        call: Call | None = None,
    ) -> None:
        """POST one request; hand each JSON-RPC message of the answer to ``on_message``. Raises
        ``OSError`` (or ``http.client.HTTPException``) when the server cannot be reached or the
        answer breaks off, and when ``call`` was aborted."""
        headers = {**self._headers, "MCP-Protocol-Version": self.protocol_version}
        body = json.dumps(message).encode()
        timeout = answer_timeout(_arguments(message))
        attach = call.attach if call is not None else None
        with posted(self.endpoint, body, headers, timeout=timeout, on_connected=attach) as response:
            for answer in _messages(response):
                on_message(answer)

    def cannot_reach(self, exc: BaseException) -> str:
        return f"cannot reach sandhold at {self.endpoint}: {exc or type(exc).__name__}"


class Call:
    """One request in flight; ``abort()`` (from any thread) closes its connection, which ends
    the wait for its answer here and cancels the call in the server."""

    def __init__(self) -> None:
        self.aborted = False
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def attach(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._connection = connection
            if self.aborted:
                _shut(connection)

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            if self._connection is not None:
                _shut(self._connection)


def _shut(connection: http.client.HTTPConnection) -> None:
    if connection.sock is not None:
        with contextlib.suppress(OSError):  # already closed by the other side
            connection.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it


def _messages(response: http.client.HTTPResponse) -> Iterator[Any]:
    """The JSON-RPC messages of an answer: one JSON body, or the ``data`` of each SSE event."""
    kind = response.getheader("Content-Type", "")
    if not kind.startswith("text/event-stream"):
        body = response.read(MAX_ANSWER_BYTES + 1)
        if not body:
            return iter(())
        if len(body) > MAX_ANSWER_BYTES:
            raise http.client.HTTPException("answer too large")
        parsed = json.loads(body)
        return iter(parsed if isinstance(parsed, list) else [parsed])
    return _events(response)


def _events(response: http.client.HTTPResponse) -> Iterator[Any]:
    """The decoded data of each event; a line or an event past the size cap, or data that is
    not JSON, raises ``ValueError`` (the answer broke off, as far as the client is told)."""
    decoder = EventDecoder()
    while line := response.readline(MAX_ANSWER_BYTES + 1):
        if len(line) > MAX_ANSWER_BYTES:
            raise http.client.HTTPException("event too large")
        if (event := decoder.feed(line.decode())) is not None:
            yield json.loads(event.data)
    if (event := decoder.end()) is not None:
        yield json.loads(event.data)


class _Front:
    """One stdio client served through ``remote``."""

    def __init__(self, remote: RemoteSandhold, early: EarlyAnswer, fd_in: int, fd_out: int):
        self._remote = remote
        self._early = early
        self._fd_in = fd_in
        self._fd_out = fd_out
        self._write_lock = threading.Lock()
        self._closed = False  # stdin ended: nothing more is written
        self._calls: dict[Any, Call] = {}  # in flight, by request id
        self._calls_lock = threading.Lock()

    def serve(self) -> None:
        for line in self._lines():
            try:
                message = json.loads(line)
            except ValueError:
                self._write(_error(None, PARSE_ERROR, "parse error: not JSON"))
                continue
            if isinstance(message, dict):
                self._dispatch(message)
        with self._write_lock:
            self._closed = True
        with self._calls_lock:
            calls = list(self._calls.values())
        for call in calls:
            call.abort()

    def _lines(self) -> Iterator[bytes]:
        pending = self._early.consumed
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    yield line
            chunk = os.read(self._fd_in, STDIN_CHUNK_BYTES)
            if not chunk:
                break
            pending += chunk
        if pending.strip():
            yield pending

    def _dispatch(self, message: dict[str, Any]) -> None:
        method, request_id = message.get("method"), message.get("id")
        if not isinstance(method, str):
            return  # a client's answer to a request of ours: none are made
        if "id" not in message:
            if method == "notifications/cancelled":
                params = message.get("params")
                cancelled = params.get("requestId") if isinstance(params, dict) else None
                with self._calls_lock:
                    call = self._calls.get(cancelled)
                if call is not None:
                    call.abort()
            return
        if request_id == self._early.request_id and method == "initialize":
            self._adopt_version(message)
            return  # answered before this module was imported
        if method == "ping":
            self._write({"jsonrpc": "2.0", "id": request_id, "result": {}})
            return
        if method == "initialize":
            self._adopt_version(message)
            early = initialize_reply(json.dumps(message).encode(), version=server_version())
            if early is not None:  # a version answered without the server, as the first frame
                self._write(json.loads(early[1]))
                return
        call = Call()
        with self._calls_lock:
            self._calls[request_id] = call
        threading.Thread(target=self._forward, args=(message, call), daemon=True).start()

    def _adopt_version(self, message: dict[str, Any]) -> None:
        params = message.get("params")
        version = params.get("protocolVersion") if isinstance(params, dict) else None
        if isinstance(version, str):
            self._remote.protocol_version = version

    def _forward(self, message: dict[str, Any], call: Call) -> None:
        request_id = message.get("id")
        answered = False

        def on_message(answer: dict[str, Any]) -> None:
            nonlocal answered
            if "method" not in answer:  # the answer itself, not a notification on the way
                answered = True
                if answer.get("id") is None:  # a front-door refusal names no request
                    answer = {**answer, "id": request_id}
                answer = {k: answer[k] for k in ("jsonrpc", "id", "result", "error") if k in answer}
            if not call.aborted:
                self._write(answer)

        try:
            self._remote.post(message, on_message, call)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if not call.aborted and not answered:
                self._write(_unavailable(message, self._remote.cannot_reach(exc)))
        finally:
            with self._calls_lock:
                if self._calls.get(request_id) is call:
                    del self._calls[request_id]

    def _write(self, message: dict[str, Any]) -> None:
        frame = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._write_lock:
            if self._closed:
                return
            view = memoryview(frame)
            try:
                while view:
                    view = view[os.write(self._fd_out, view) :]
            except OSError:  # the client has gone: nothing more can reach it
                self._closed = True


def _error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _unavailable(message: dict[str, Any], reason: str) -> dict[str, Any]:
    """The answer to ``message`` when the server cannot be reached: for a tool call the tool
    contract's ``backend_unavailable`` result, for anything else a JSON-RPC error."""
    params = message.get("params")
    if message.get("method") != "tools/call" or not isinstance(params, dict):
        return _error(message.get("id"), INTERNAL_ERROR, reason)
    structured = failure(_arguments(message), "backend_unavailable", reason)
    text = f"{params.get('name')}.{structured['operation']}: backend_unavailable\n"
    text += f"error_message: {reason}"
    result = {
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": True,
    }
    return {"jsonrpc": "2.0", "id": message.get("id"), "result": result}


def serve_stdio_forwarding(
    remote: RemoteSandhold, *, early: EarlyAnswer | None = None, fd_in: int = 0, fd_out: int = 1
) -> None:
    """Serve one MCP client on ``fd_in``/``fd_out`` through ``remote`` until ``fd_in`` ends;
    ``early`` is what ``handshake.answer_initialize_early`` read and answered already."""
    _Front(remote, early or EarlyAnswer(), fd_in, fd_out).serve()
