"""Blocking calls on ``sandhold serve`` over the standard library's ``http.client``: what a
one-shot command (``sandhold call``, ``sandhold shell --server`` from a worker thread) and the
MCP front (``sandhold mcp --connect``, which must start in a few tens of milliseconds and so
imports no HTTP library) use. ``http.client`` is imported when the first call is made, so a
command that only lists its help never pays for it (nor for ``ssl``).

Every wait is bounded: reaching the server and sending by ``CONNECT_TIMEOUT``, each silence in
the answer by the timeout the caller gives (``answer_timeout``). Every connection is closed on
every path when its ``posted`` block ends.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.client._address import checked_url
from orchestrator.client._answers import (
    ANSWER_TIMEOUT,
    CONNECT_TIMEOUT,
    MAX_ANSWER_BYTES,
    tool_result,
)
from orchestrator.errors import BackendUnavailableError, OrchestratorError

if TYPE_CHECKING:
    import http.client

__all__ = ["Answer", "ServerClient", "posted"]


@contextmanager
def posted(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout: float,
    on_connected: Callable[[http.client.HTTPConnection], None] | None = None,
) -> Iterator[http.client.HTTPResponse]:
    """POST ``body`` to ``url`` and yield the response, its headers read; each later read
    waits at most ``timeout`` through silence. ``on_connected`` is handed the connection once
    the request is sent (to close it from another thread: ``sock.shutdown`` wakes the reader).
    Raises ``OSError`` or ``http.client.HTTPException`` when the server cannot be reached or the
    answer breaks off."""
    import http.client

    parts = urllib.parse.urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.netloc, timeout=CONNECT_TIMEOUT)
    try:
        connection.request("POST", path, body, dict(headers))
        if on_connected is not None:
            on_connected(connection)
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        yield connection.getresponse()
    finally:
        connection.close()


@dataclass(frozen=True)
class Answer:
    """A server's answer: the HTTP status and the structured result (``success`` first)."""

    status: int
    result: dict[str, Any]

    @property
    def request_failed(self) -> bool:
        """The request itself failed (any status but 200), as opposed to the work it asked for."""
        return self.status != 200


class ServerClient:
    """Tool calls over the REST API of the ``sandhold serve`` at ``url``, with ``key``: one
    blocking ``POST /v1/{tool}`` each, the tool's arguments as the body."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url.rstrip("/")
        self._key = key

    def call(self, tool: str, arguments: Any, *, timeout: float = ANSWER_TIMEOUT) -> Answer:
        """The answer to one call; ``backend_unavailable`` when the server cannot be reached,
        ``internal`` when what it answered is not a tool result."""
        import http.client

        endpoint = f"{checked_url(self.url, name='server URL')}/v1/"
        endpoint += urllib.parse.quote(tool, safe="")
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        body = json.dumps(arguments).encode()
        try:
            with posted(endpoint, body, headers, timeout=timeout) as reply:
                status, answered = reply.status, reply.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            reason = exc or type(exc).__name__
            raise BackendUnavailableError(
                f"cannot reach sandhold at {self.url}: {reason}"
            ) from None
        return Answer(status, _result(answered, status))


def _result(body: bytes, status: int) -> dict[str, Any]:
    if len(body) > MAX_ANSWER_BYTES:
        raise OrchestratorError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
    try:
        result = tool_result(json.loads(body))
    except ValueError:
        result = None
    if result is None:
        raise OrchestratorError(f"the server answered HTTP {status} without a sandhold result")
    return result
