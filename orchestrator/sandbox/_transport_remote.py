"""The remote transport: a ``sandhold serve`` over its REST API, with an API key.

Every call is ``POST /v1/{tool}`` with the tool's arguments as the body: the generic route, the
same contract as in-process. A cell whose output is watched goes to
``POST /v1/sessions/{id}/execute`` with ``Accept: text/event-stream`` instead: ``stdout`` and
``stderr`` events as the cell prints, then one ``result`` event, the structured result.

What the server answers is read as the tool contract; a server that cannot be reached answers
``backend_unavailable``, and an answer that is not the contract (not JSON, no ``result`` event)
``internal``, both as structured results, so the caller raises them like any other refusal.
The waits, the address, those failures and the event reader are ``orchestrator.client``'s,
shared with ``sandhold call`` and ``sandhold mcp --connect``.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from orchestrator.client import (
    ANSWER_TIMEOUT,
    CONNECT_TIMEOUT,
    KEY_VARIABLE,
    TASK_HEADER,
    EventDecoder,
    answer_timeout,
    checked_url,
    failure,
    tool_result,
    url_from_env,
)
from orchestrator.errors import InvalidArgumentError
from orchestrator.sandbox._transport import Listener

__all__ = ["RemoteTransport", "remote_settings"]


def remote_settings(url: str | None, api_key: str | None) -> tuple[str, str] | None:
    """The server's address and key from the arguments or ``SANDHOLD_URL``/``SANDHOLD_API_KEY``;
    None when neither names a server (the sandbox is then local)."""
    url = url or url_from_env(_deprecated)
    if not url:
        return None
    key = api_key or os.environ.get(KEY_VARIABLE)
    if not key:
        raise InvalidArgumentError(f"a remote sandbox needs an API key: api_key= or {KEY_VARIABLE}")
    return checked_url(url), key


def _deprecated(message: str) -> None:
    # Points at the caller of Sandbox.create/connect: this, url_from_env, remote_settings, the
    # Sandbox API's method, its caller.
    warnings.warn(message, DeprecationWarning, stacklevel=5)


class RemoteTransport:
    """Calls on the server at ``url`` with ``api_key`` (and ``task``, if any). Made inside the
    event loop that uses it: its connection pool belongs to that loop."""

    def __init__(self, url: str, api_key: str, *, task: str | None = None) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {api_key}"}
        if task:
            headers[TASK_HEADER] = task
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
            return failure(arguments, "backend_unavailable", reason)

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
        return failure(arguments, "internal", "the event stream ended without a result")

    @staticmethod
    def _timeout(arguments: dict[str, Any]) -> httpx2.Timeout:
        return httpx2.Timeout(CONNECT_TIMEOUT, read=answer_timeout(arguments))

    async def aclose(self) -> None:
        await self._http.aclose()


def _structured(response: httpx2.Response, arguments: dict[str, Any]) -> dict[str, Any]:
    try:
        structured = tool_result(response.json())
    except ValueError:
        structured = None
    if structured is not None:
        return structured
    reason = f"the server answered HTTP {response.status_code} without a tool result"
    return failure(arguments, "internal", reason)


async def _events(response: httpx2.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event name, decoded data) of each server-sent event; data that is not JSON is not an
    event of ours (skipped: the result still comes). An event past the size cap ends the
    stream: the server never sends one, so no result follows."""
    decoder = EventDecoder()
    async for line in response.aiter_lines():
        try:
            event = decoder.feed(line)
        except ValueError:
            return
        if event is None:
            continue
        try:
            yield event.name, json.loads(event.data)
        except ValueError:
            continue
