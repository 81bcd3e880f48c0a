"""E2B's control API (``E2B_API_URL``): sandboxes created, listed, looked up, given a new
lifetime, paused, resumed and killed, each one a sandhold session of the tenant whose key the
request carries (``X-API-KEY``; the front door, ``orchestrator.http``, has resolved it and
bounded the body before any route here runs).

Bounds as on every surface: ``metadata`` is checked as a session's is (``check_metadata``: keys,
per-value and total size); listings are paginated (``limit`` up to ``MAX_LIST_LIMIT``, E2B's own,
and ``nextToken``, answered in ``x-next-token``).

Templates: ``base`` is sandhold's ``shell`` policy (bash, full Python, a shell-first session),
``code-interpreter-v1`` the ``code-interpreter`` policy (pandas, matplotlib..., and node for
JavaScript contexts); any other
``templateID`` that names a policy of this server is that policy. Anything else is E2B's 404.
What E2B offers and sandhold does not (template builds, snapshots, forks, volumes, logs) is
answered 501 with a message saying so, never left hanging."""

from __future__ import annotations

import base64
import binascii
import builtins
import datetime
import secrets
import urllib.parse
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator._core.session_control import check_metadata
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.http import CALLER_SCOPE_KEY, Caller
from orchestrator.http.e2b._errors import e2b_error, status_of
from orchestrator.http.e2b._sandboxes import E2bSandbox, SandboxTable, utc_now
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["ENVD_VERSION", "TEMPLATES", "Control"]

TEMPLATES: Final = {"base": "shell", "code-interpreter-v1": "code-interpreter"}
# The envd version the SDK is told: 0.5.7 has what this server implements (default user,
# stdin close, octet-stream uploads) and nothing it does not (file metadata, 0.6.2).
ENVD_VERSION: Final = "0.5.7"
DEFAULT_TIMEOUT_S: Final = 300
# E2B's own ceiling on a sandbox's lifetime (24 h on its top plan).
MAX_TIMEOUT_S: Final = 86_400
CLIENT_ID: Final = "sandhold"
# Sandboxes per page of a listing: E2B's own default and maximum.
MAX_LIST_LIMIT: Final = 100
NEXT_TOKEN_HEADER: Final = "x-next-token"  # noqa: S105 (a header's name)
# What a listed sandbox reports of its resources: the policy's limits are not in the tool
# layer's answers, and the SDK requires the fields.
_CPU, _MEMORY_MB, _DISK_MB = 1, 512, 1024

_ANY_METHOD: Final = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_NOT_SUPPORTED: Final = (
    "templates", "snapshots", "volumes", "fork", "logs", "refreshes", "network", "secrets",
)  # fmt: skip


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class Control:
    def __init__(self, orchestrator: Any, table: SandboxTable) -> None:
        self.orchestrator = orchestrator
        self.table = table

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes", self.create, methods=["POST"]),
            Route("/v2/sandboxes", self.create, methods=["POST"]),
            Route("/sandboxes", self.list, methods=["GET"]),
            Route("/v2/sandboxes", self.list, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", self.get, methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", self.kill, methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/timeout", self.set_timeout, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/connect", self.connect, methods=["POST"]),
            Route("/v2/sandboxes/{sandbox_id}/connect", self.connect, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/pause", self.pause, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/resume", self.resume, methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/metrics", self.metrics, methods=["GET"]),
            Route("/{rest:path}", self.unsupported, methods=_ANY_METHOD),
        ]  # fmt: skip

    # -- helpers
    def tenant(self, request: Request) -> str | None:
        """The tenant the front door found for the request's key."""
        caller = request.scope.get(CALLER_SCOPE_KEY)
        return caller.tenant if isinstance(caller, Caller) else None

    def policy_for(self, template: str) -> str | None:
        if template in TEMPLATES:
            return TEMPLATES[template]
        try:
            self.orchestrator.policy(template)
        except (OrchestratorError, ValueError, TypeError):
            return None
        return template

    async def _sandbox(self, request: Request) -> tuple[str, E2bSandbox] | Response:
        tenant = self.tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        sandbox_id = request.path_params["sandbox_id"]
        sandbox = self.table.of_tenant(sandbox_id, tenant)
        if sandbox is None or not await self._alive(sandbox):
            return e2b_error(404, f"sandbox {sandbox_id!r} not found")
        return tenant, sandbox

    async def _sandbox_and_timeout(
        self, request: Request, *, required: bool
    ) -> tuple[str, E2bSandbox, int | None] | Response:
        """The caller's sandbox (``_sandbox``) and the body's ``timeout``, checked when given;
        without one, None, or a 400 when ``required``."""
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        try:
            body = await request.json()
        except ValueError:
            body = None
        timeout = body.get("timeout") if isinstance(body, dict) else None
        if (timeout is not None or required) and (problem := _check_timeout(timeout)):
            return e2b_error(400, problem)
        return *found, timeout

    async def _alive(self, sandbox: E2bSandbox) -> bool:
        """Whether its session still exists (idle teardown or max lifetime may have ended it);
        a sandbox whose session is gone leaves the table."""
        listed = await call(self.orchestrator, sandbox.tenant, "python_repl", "list_sessions")
        alive = any(s.get("session_id") == sandbox.session_id for s in listed["sessions"])
        if not alive:
            self.table.remove(sandbox.sandbox_id)
        return alive

    def created(self, sandbox: E2bSandbox, status: int = 201) -> JSONResponse:
        return JSONResponse(
            {
                "sandboxID": sandbox.sandbox_id,
                "templateID": sandbox.template,
                "clientID": CLIENT_ID,
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": sandbox.access_token,
                "trafficAccessToken": sandbox.access_token,
                "domain": None,
            },
            status_code=status,
        )

    def listed(self, sandbox: E2bSandbox) -> dict[str, Any]:
        return {
            "templateID": sandbox.template,
            "sandboxID": sandbox.sandbox_id,
            "clientID": CLIENT_ID,
            "startedAt": _iso(sandbox.started_at),
            "endAt": _iso(sandbox.end_at),
            "cpuCount": _CPU,
            "memoryMB": _MEMORY_MB,
            "diskSizeMB": _DISK_MB,
            "state": sandbox.state,
            "envdVersion": ENVD_VERSION,
            "metadata": sandbox.metadata,
        }

    # -- routes
    async def create(self, request: Request) -> Response:
        tenant = self.tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        try:
            body = await request.json()
        except ValueError:
            return e2b_error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return e2b_error(400, "the body is not a JSON object")
        return await self._create(tenant, body)

    async def _create(self, tenant: str, body: dict[str, Any]) -> Response:
        template = body.get("templateID")
        if not isinstance(template, str):
            return e2b_error(400, "templateID is required")
        policy = self.policy_for(template)
        if policy is None:
            return e2b_error(404, f"template '{template}' not found")
        timeout = body.get("timeout", DEFAULT_TIMEOUT_S)
        metadata = body.get("metadata") or {}
        envs = body.get("envVars") or {}
        problem = _check_create(timeout, metadata, envs, body)
        if problem:
            return e2b_error(400, problem)
        try:
            metadata = check_metadata(metadata)
        except InvalidArgumentError as exc:
            return e2b_error(400, f"invalid_argument: {exc}")
        try:
            created = await call(
                self.orchestrator, tenant, "session", "create", policy=policy, env=envs or None
            )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        now = utc_now()
        sandbox = E2bSandbox(
            sandbox_id=self.table.new_id(),
            tenant=tenant,
            session_id=created["session_id"],
            template=template,
            policy=policy,
            access_token=secrets.token_urlsafe(32),
            metadata=dict(metadata),
            envs=dict(envs),
            started_at=now,
            end_at=now + datetime.timedelta(seconds=timeout),
            timeout_s=timeout,
            auto_pause=body.get("autoPause") is True,
        )
        self.table.add(sandbox)
        return self.created(sandbox)

    async def list(self, request: Request) -> Response:
        tenant = self.tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        try:
            limit = _list_limit(request.query_params.get("limit"))
            after = _from_token(request.query_params.get("nextToken"))
        except InvalidArgumentError as exc:
            return e2b_error(400, f"invalid_argument: {exc}")
        wanted = _metadata_filter(request.query_params.get("metadata"))
        states = request.query_params.get("state")
        allowed = set(states.split(",")) if states else {"running", "paused"}
        template = request.query_params.get("template")
        chosen = [
            sandbox
            for sandbox in await self._alive_of(tenant)
            if sandbox.state in allowed
            and not (template and sandbox.template != template)
            and all(sandbox.metadata.get(k) == v for k, v in wanted.items())
            and (after is None or _place(sandbox) > after)
        ]
        chosen.sort(key=_place)
        page = chosen[:limit]
        headers = {NEXT_TOKEN_HEADER: _token(page[-1])} if len(chosen) > limit else {}
        return JSONResponse([self.listed(sandbox) for sandbox in page], headers=headers)

    async def _alive_of(self, tenant: str) -> builtins.list[E2bSandbox]:
        """The tenant's sandboxes whose sessions still exist, in one ``list_sessions``."""
        listed = await call(self.orchestrator, tenant, "python_repl", "list_sessions")
        live = {s.get("session_id") for s in listed["sessions"]}
        alive = []
        for sandbox in self.table.listed(tenant):
            if sandbox.session_id in live:
                alive.append(sandbox)
            else:
                self.table.remove(sandbox.sandbox_id)
        return alive

    async def get(self, request: Request) -> Response:
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        _, sandbox = found
        detail = self.listed(sandbox) | {
            "envdAccessToken": sandbox.access_token,
            "trafficAccessToken": sandbox.access_token,
            "domain": None,
        }
        return JSONResponse(detail)

    async def kill(self, request: Request) -> Response:
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        tenant, sandbox = found
        self.table.remove(sandbox.sandbox_id)
        try:
            await call(
                self.orchestrator, tenant, "python_repl", "destroy", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        found = await self._sandbox_and_timeout(request, required=True)
        if isinstance(found, Response):
            return found
        _, sandbox, timeout = found
        assert timeout is not None  # required: checked
        sandbox.set_timeout(timeout)
        return Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        found = await self._sandbox_and_timeout(request, required=False)
        if isinstance(found, Response):
            return found
        tenant, sandbox, timeout = found
        if sandbox.state == "paused":
            return await self._resume(tenant, sandbox, timeout)
        if timeout is not None:
            # Connecting never shortens a running sandbox's life, as in E2B.
            wanted = utc_now() + datetime.timedelta(seconds=timeout)
            sandbox.end_at = max(sandbox.end_at, wanted)
        return self.created(sandbox, status=200)

    async def pause(self, request: Request) -> Response:
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        tenant, sandbox = found
        if sandbox.state == "paused":
            return e2b_error(409, f"sandbox {sandbox.sandbox_id!r} is already paused")
        try:
            await call(self.orchestrator, tenant, "session", "pause", session_id=sandbox.session_id)
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        sandbox.state = "paused"
        return Response(status_code=204)

    async def resume(self, request: Request) -> Response:
        found = await self._sandbox_and_timeout(request, required=False)
        if isinstance(found, Response):
            return found
        tenant, sandbox, timeout = found
        if sandbox.state != "paused":
            return e2b_error(409, f"sandbox {sandbox.sandbox_id!r} is not paused")
        return await self._resume(tenant, sandbox, timeout)

    async def _resume(self, tenant: str, sandbox: E2bSandbox, timeout: int | None) -> Response:
        """The session resumed, and a new lifetime from now: the one asked for, else the last
        one the sandbox had (its clock stood still while it was paused)."""
        try:
            await call(
                self.orchestrator, tenant, "session", "resume", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        sandbox.state = "running"
        sandbox.set_timeout(timeout if timeout is not None else sandbox.timeout_s)
        return self.created(sandbox)

    async def metrics(self, request: Request) -> Response:
        """One entry, sampled now, from the session's ``metrics`` (its container's cgroup usage
        as the engine reports it). E2B keeps a history; sandhold samples when asked, so the list
        holds the present only. CPU is a rate between two samples: 0 on a sandbox's first."""
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        tenant, sandbox = found
        try:
            figures = await call(
                self.orchestrator, tenant, "session", "metrics", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        sampled = datetime.datetime.fromisoformat(str(figures["sampled_at"]))
        return JSONResponse([_metric(figures, sampled)])

    async def unsupported(self, request: Request) -> Response:
        if self.tenant(request) is None:
            return e2b_error(401, "Invalid API key")
        path = request.url.path
        if any(part in path.split("/") for part in _NOT_SUPPORTED):
            return e2b_error(501, f"{request.method} {path}: not supported by sandhold")
        return e2b_error(404, f"{request.method} {path}: no such route")


def _metric(figures: dict[str, Any], sampled: datetime.datetime) -> dict[str, Any]:
    """A session's ``metrics`` as an E2B ``SandboxMetric``; disk is not measured (0)."""
    return {
        "timestamp": _iso(sampled),
        "timestampUnix": int(sampled.timestamp()),
        "cpuCount": _CPU,
        "cpuUsedPct": float(figures.get("cpu_percent") or 0.0),
        "memUsed": int(figures.get("memory_bytes") or 0),
        "memTotal": int(figures.get("memory_limit_bytes") or 0),
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": _DISK_MB * 1024 * 1024,
    }


def _check_timeout(timeout: Any) -> str | None:
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        return "timeout must be a whole number of seconds"
    if not 0 < timeout <= MAX_TIMEOUT_S:
        return f"timeout must be between 1 and {MAX_TIMEOUT_S} seconds"
    return None


def _strings(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _check_create(timeout: Any, metadata: Any, envs: Any, body: dict[str, Any]) -> str | None:
    if not _strings(metadata):
        return "metadata must map strings to strings"
    if not _strings(envs):
        return "envVars must map strings to strings"
    if body.get("volumeMounts"):
        return "volume mounts are not supported by sandhold"
    if body.get("mcp"):
        return "MCP servers in a sandbox are not supported by sandhold"
    if not isinstance(body.get("autoPause", False), bool):
        return "autoPause must be true or false"
    resume = body.get("autoResume")
    if isinstance(resume, dict) and resume.get("enabled"):
        return "auto-resume is not supported by sandhold: resume with connect()"
    return _check_timeout(timeout)


def _list_limit(raw: str | None) -> int:
    if raw is None:
        return MAX_LIST_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise InvalidArgumentError(f"limit must be a whole number from 1 to {MAX_LIST_LIMIT}")
    return int(raw)


def _place(sandbox: E2bSandbox) -> tuple[str, str]:
    """Where a sandbox stands in a listing: by start, then id (unique)."""
    return _iso(sandbox.started_at), sandbox.sandbox_id


def _token(sandbox: E2bSandbox) -> str:
    """The next page starts after this sandbox (which may be gone by then)."""
    started, sandbox_id = _place(sandbox)
    return base64.urlsafe_b64encode(f"{started}|{sandbox_id}".encode()).decode("ascii")


def _from_token(raw: str | None) -> tuple[str, str] | None:
    if not raw:
        return None
    try:
        started, sep, sandbox_id = base64.urlsafe_b64decode(raw[:200]).decode().partition("|")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidArgumentError("nextToken is not one this server gave") from None
    if not sep:
        raise InvalidArgumentError("nextToken is not one this server gave")
    return started, sandbox_id


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDK sends ``metadata=`` a query string of its own, each key and value quoted."""
    if not raw:
        return {}
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}
