"""The remote transport: a ``sandhold serve`` over its REST API, with an API key.

Every call is ``POST /v1/{tool}`` with the tool's arguments as the body: the generic route, the
same contract as in-process. A cell whose output is watched goes to
``POST /v1/sessions/{id}/execute`` with ``Accept: text/event-stream`` instead: ``stdout`` and
``stderr`` events as the cell prints, then one ``result`` event, the structured result.

What the server answers is read as the tool contract; a server that cannot be reached answers
``backend_unavailable``, and an answer that is not the contract (not JSON, no ``result`` event)
``internal``, both as structured results, so the caller raises them like any other refusal.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Final

import httpx2

from orchestrator.errors import InvalidArgumentError
from orchestrator.sandbox._transport import Listener

__all__ = ["RemoteTransport", "remote_settings"]

URL_VARIABLE: Final = "SANDHOLD_URL"
# The CLI's name for the address before issue 32: read when SANDHOLD_URL is not set, with a
# DeprecationWarning, so one name works everywhere (the CLI reads SANDHOLD_URL too).
DEPRECATED_URL_VARIABLE: Final = "SANDHOLD_SERVER"
KEY_VARIABLE: Final = "SANDHOLD_API_KEY"
# Reaching a server and sending a request take at most this long on any network worth using.
CONNECT_TIMEOUT: Final = 10.0
# The longest silence to wait through for an answer: the default policy's longest command
# (300 s) and a margin; a call naming a longer timeout_s gets that plus the margin.
ANSWER_TIMEOUT: Final = 330.0
ANSWER_MARGIN: Final = 30.0
# No policy allows a timeout_s beyond a day; no wait is made longer than that.
MAX_TIMEOUT_S: Final = 86_400.0


def remote_settings(url: str | None, api_key: str | None) -> tuple[str, str] | None:
    """The server's address and key from the arguments or ``SANDHOLD_URL``/``SANDHOLD_API_KEY``;
    None when neither names a server (the sandbox is then local)."""
    url = url or _url_from_env()
    if not url:
        return None
    key = api_key or os.environ.get(KEY_VARIABLE)
    if not key:
        raise InvalidArgumentError(f"a remote sandbox needs an API key: api_key= or {KEY_VARIABLE}")
    if not url.startswith(("http://", "https://")):
        raise InvalidArgumentError(f"url must be http(s)://host:port, got {url!r}")
    return url.rstrip("/"), key


def _url_from_env() -> str | None:
    if url := os.environ.get(URL_VARIABLE):
        return url
    if url := os.environ.get(DEPRECATED_URL_VARIABLE):
        warnings.warn(
            f"{DEPRECATED_URL_VARIABLE} is deprecated; set {URL_VARIABLE} instead",
            DeprecationWarning,
            stacklevel=4,
        )
        return url
    return None


def _answer_timeout(arguments: dict[str, Any]) -> float:
    given = arguments.get("timeout_s")
    if isinstance(given, int | float) and not isinstance(given, bool) and given > 0:
        return max(ANSWER_TIMEOUT, min(float(given), MAX_TIMEOUT_S) + ANSWER_MARGIN)
    return ANSWER_TIMEOUT


def _failure(arguments: dict[str, Any], error_type: str, message: str) -> dict[str, Any]:
    operation = arguments.get("operation")
    return {
        "success": False,
        "operation": operation if isinstance(operation, str) else None,
        "error_type": error_type,
        "error_message": message,
    }


class RemoteTransport:
    """Calls on the server at ``url`` with ``api_key`` (and ``task``, if any). Made inside the
    event loop that uses it: its connection pool belongs to that loop."""

    def __init__(self, url: str, api_key: str, *, task: str | None = None) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {api_key}"}
        if task:
            headers["X-Sandhold-Task"] = task
        timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=ANSWER_TIMEOUT)
        self._http = httpx2.AsyncClient(base_url=url, headers=headers, timeout=timeout)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        on_stdout: Listener | None = None,
        on_stderr: Listener | None = None,
    ) -> dict[str, Any]:
        session_id = arguments.get("session_id")
        watched = on_stdout is not None or on_stderr is not None
        try:
            execute = tool == "python_repl" and arguments.get("operation") == "execute"
            if execute and watched and isinstance(session_id, str):
                return await self._streamed(session_id, arguments, on_stdout, on_stderr)
            return await self._posted(tool, arguments)
        except httpx2.TransportError as exc:
            reason = f"cannot reach sandhold at {self.url}: {exc or type(exc).__name__}"
            return _failure(arguments, "backend_unavailable", reason)

    async def _posted(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        response = await self._http.post(
            f"/v1/{tool}", json=arguments, timeout=self._timeout(arguments)
        )
        return _structured(response, arguments)

    async def _streamed(
        self,
        session_id: str,
        arguments: dict[str, Any],
        on_stdout: Listener | None,
        on_stderr: Listener | None,
    ) -> dict[str, Any]:
        body = {k: v for k, v in arguments.items() if k not in ("operation", "session_id")}
        listeners = {"stdout": on_stdout, "stderr": on_stderr}
        request = self._http.stream(
            "POST",
            f"/v1/sessions/{session_id}/execute",
            json=body,
            headers={"Accept": "text/event-stream"},
            timeout=self._timeout(arguments),
        )
        async with request as response:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                await response.aread()  # a refusal before the stream: the JSON result
                return _structured(response, arguments)
            async for name, data in _events(response):
                if name == "result" and isinstance(data, dict):
                    return data
                listener = listeners.get(name)
                if listener is not None and isinstance(data, dict):
                    listener(str(data.get("text", "")))
        return _failure(arguments, "internal", "the event stream ended without a result")

    @staticmethod
    def _timeout(arguments: dict[str, Any]) -> httpx2.Timeout:
        return httpx2.Timeout(CONNECT_TIMEOUT, read=_answer_timeout(arguments))

    async def aclose(self) -> None:
        await self._http.aclose()


def _structured(response: httpx2.Response, arguments: dict[str, Any]) -> dict[str, Any]:
    try:
        structured = response.json()
    except ValueError:
        structured = None
    if isinstance(structured, dict) and "success" in structured:
        return structured
    reason = f"the server answered HTTP {response.status_code} without a tool result"
    return _failure(arguments, "internal", reason)


async def _events(response: httpx2.Response) -> Any:
    """(event name, decoded data) of each server-sent event; comments are keep-alives."""
    name: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            decoded: Any = _decoded(data) if name is not None else None
            if name is not None and decoded is not None:
                yield name, decoded
            name, data = None, []
        elif line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").removeprefix(" "))


def _decoded(data: list[str]) -> Any:
    """An event's data; None for what is not an event of ours (skipped: the result still comes)."""
    try:
        return json.loads("\n".join(data)) if data else None
    except ValueError:
        return None
