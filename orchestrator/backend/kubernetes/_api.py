"""The few REST calls the backend makes to the API server (Pods in one namespace: create, get,
list, delete, watch), over one ``httpx2`` client, with the API server's answers translated in
this one place: 404 is ``ContainerNotFoundError``, a refused connection or a timeout
``BackendUnavailableError``, any other failure (409 included: a Pod of that name exists)
``BackendError`` carrying the ``Status``'s message, caused by an ``ApiStatus`` with its code and
reason.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import httpx2

from orchestrator.backend.kubernetes._settings import ClusterConnection
from orchestrator.errors import BackendError, BackendUnavailableError, ContainerNotFoundError

__all__ = ["ApiClient", "ApiStatus", "api_status", "checked"]

# A REST call to the API server is milliseconds; past this it is in trouble (etcd, most often).
REQUEST_TIMEOUT = 30.0
# A watch stays open until the server ends it (it does after a few minutes) or we stop reading.
WATCH_TIMEOUT_S = 300
HINT = "check the kubeconfig and that the API server answers (docs/kubernetes.md)"


class ApiStatus(Exception):
    """The API server's refusal, kept as the cause of the ``BackendError`` raised for it: its
    HTTP status and the ``Status``'s ``reason`` (``AlreadyExists``, ``Forbidden``, ``Invalid``,
    ``Expired``...), for callers that act on one (a probe Pod that exists already)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


def api_status(error: BaseException) -> ApiStatus | None:
    """The API server's answer behind ``error``, if it was one."""
    cause = error.__cause__
    return cause if isinstance(cause, ApiStatus) else None


class ApiClient:
    def __init__(self, connection: ClusterConnection) -> None:
        self.connection = connection
        self.namespace = connection.namespace
        self._http = httpx2.AsyncClient(
            base_url=connection.server,
            verify=connection.ssl_context,
            headers=dict(connection.headers),
            timeout=REQUEST_TIMEOUT,
            trust_env=False,  # never through a proxy: the cluster only
        )

    def pods_path(self, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods"
        return base if name is None else f"{base}/{quote(name, safe='')}"

    async def request(
        self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        try:
            answer = await self._http.request(
                method, path, json=body, params=dict(params) if params else None
            )
        except httpx2.TimeoutException:
            raise BackendUnavailableError(
                f"the API server did not answer {method} {path} in time", hint=HINT
            ) from None
        except httpx2.TransportError as exc:
            raise BackendUnavailableError(
                f"the API server does not answer: {exc}", hint=HINT
            ) from None
        return checked(answer.status_code, answer.content, f"{method} {path}")

    async def watch(
        self, path: str, params: Mapping[str, str]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a watch (``type``, ``object``), until the server ends it."""
        query = {**params, "watch": "1", "timeoutSeconds": str(WATCH_TIMEOUT_S)}
        try:
            async with self._http.stream(
                "GET", f"{path}?{urlencode(query)}", timeout=None
            ) as answer:
                if answer.status_code != 200:
                    checked(answer.status_code, await answer.aread(), f"watch {path}")
                async for line in answer.aiter_lines():
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        except httpx2.TransportError as exc:
            raise BackendUnavailableError(f"a watch broke: {exc}", hint=HINT) from None

    def websocket_url(self, path: str, query: list[tuple[str, str]]) -> str:
        server = self.connection.server.replace("https://", "wss://", 1)
        return f"{server}{path}?{urlencode(query)}"

    async def aclose(self) -> None:
        await self._http.aclose()


def checked(status: int, content: bytes, what: str) -> dict[str, Any]:
    """The answer's JSON object, or the error its status says (the one place they are read)."""
    try:
        data = json.loads(content) if content else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if 200 <= status < 300:
        return data
    message = str(data.get("message") or content[:300].decode(errors="replace"))
    if status == 404:
        raise ContainerNotFoundError(message)
    if status in (502, 503, 504):
        raise BackendUnavailableError(f"{what}: {status} {message}", hint=HINT)
    reason = str(data.get("reason") or "")
    raise BackendError(
        f"{what}: the API server answered {status} {reason}: {message}".replace("  ", " ")
    ) from ApiStatus(status, reason)
