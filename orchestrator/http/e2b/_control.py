"""E2B's control API (``E2B_API_URL``): sandboxes created, listed, looked up, given a new
lifetime, paused, resumed and killed, each one a sandhold session of the tenant whose key the
request carries (``X-API-KEY``; the front door, ``orchestrator.http``, has resolved it and
bounded the body before any route here runs).

A thin adapter: a sandbox's life is its session's, kept by the core. Its lifetime is the core's
``set_timeout`` (create, ``set_timeout``, connect, resume), with the end action ``pause`` for
E2B's auto-pause (``autoPause``, ``lifecycle.on_timeout``); its metadata is the session's; paused
or running is the session's; a resume is the core's, which gives a session its end paused the
lifetime it last had. All of it survives a restart of ``serve`` with the session (the
registry). What the E2B port keeps itself is in ``_sandboxes``.

Bounds as on every surface: ``metadata`` is checked as a session's is (``check_metadata``: keys,
per-value and total size); listings are paginated (``limit`` up to ``MAX_LIST_LIMIT``, E2B's own,
and ``nextToken``, answered in ``x-next-token``), newest first unless ``order=asc``.

Templates: ``base`` is sandhold's ``e2b`` policy (the shell policy, dangerous commands unconfirmed),
``code-interpreter-v1`` the ``code-interpreter`` policy (pandas, matplotlib..., and node for
JavaScript contexts); any other
``templateID`` that names a policy of this server is that policy; a ready template build of the
caller's tenant (``_templates``: its name, id or ``name:tag``) is the ``e2b`` policy over the
build's image. Anything else is E2B's 404.
What E2B offers and sandhold does not (volumes, logs, ...) is
answered 501 with a message saying so, never left hanging."""

from __future__ import annotations

import base64
import binascii
import builtins
import contextlib
import dataclasses
import datetime
import secrets
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator._core import check_metadata, lifetime_end
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.http import CALLER_SCOPE_KEY, E2B_STATUS, Caller, status_for
from orchestrator.http.e2b._errors import e2b_error, status_of
from orchestrator.http.e2b._network import apply_network
from orchestrator.http.e2b._sandboxes import E2bSandbox, SandboxTable, utc_now
from orchestrator.http.e2b._snapshots import snapshot_template
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["ENVD_VERSION", "TEMPLATES", "Control"]

TEMPLATES: Final = {"base": "e2b", "code-interpreter-v1": "code-interpreter"}
# The envd version the SDK is told: 0.6.4 has what this server implements (default user,
# stdin close, octet-stream uploads, file metadata, watch events with entries, watches that
# allow network mounts) and nothing it does not.
ENVD_VERSION: Final = "0.6.4"
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


@dataclasses.dataclass(frozen=True)
class Life:
    """What the core says of a sandbox's session now: the E2B port keeps none of it."""

    paused: bool
    ends_at: datetime.datetime
    metadata: dict[str, str]
    on_timeout: str  # E2B's words: "kill" or "pause"


def life_of(session: Any) -> Life:
    """A core session's state in E2B's terms; its end from the monotonic clock to the wall's."""
    remaining = lifetime_end(session) - time.monotonic()
    ends_at = utc_now() + datetime.timedelta(seconds=remaining)
    return Life(
        paused=bool(session.paused),
        # To the millisecond, down: two clocks read one after the other never add to it.
        ends_at=ends_at.replace(microsecond=ends_at.microsecond // 1000 * 1000),
        metadata=dict(session.metadata),
        on_timeout="pause" if session.lifetime_end_action == "pause" else "kill",
    )


def refusal(exc: OrchestratorError) -> Response:
    """A core refusal as E2B answers it: the status from the front door's table."""
    return e2b_error(status_for(exc, E2B_STATUS), f"{exc.code}: {exc}")


class Control:
    def __init__(
        self,
        orchestrator: Any,
        table: SandboxTable,
        build_image: Callable[[str, str], str | None] | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.table = table
        # The image of a ready template build of the tenant's, by name (``_templates``).
        self.build_image = build_image or (lambda tenant, name: None)

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes", self.create, methods=["POST"]),
            Route("/v2/sandboxes", self.create, methods=["POST"]),
            Route("/sandboxes", self.list_running, methods=["GET"]),
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

    def session_of(self, sandbox: E2bSandbox) -> Any | None:
        """The sandbox's core session, or None when it has ended (the sandbox then leaves the
        table: its row went with the session's, or goes now)."""
        try:
            return self.orchestrator.find_session(sandbox.session_id, tenant=sandbox.tenant)
        except OrchestratorError:
            self.table.remove(sandbox.sandbox_id)
            return None

    async def _sandbox(self, request: Request) -> tuple[str, E2bSandbox, Any] | Response:
        """The caller's sandbox and its core session, or E2B's 404 (unknown, another tenant's,
        ended: alike)."""
        tenant = self.tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        sandbox_id = request.path_params["sandbox_id"]
        sandbox = self.table.of_tenant(sandbox_id, tenant)
        session = self.session_of(sandbox) if sandbox is not None else None
        if sandbox is None or session is None:
            return e2b_error(404, f"sandbox {sandbox_id!r} not found")
        return tenant, sandbox, session

    async def _sandbox_and_timeout(
        self, request: Request, *, required: bool
    ) -> tuple[str, E2bSandbox, Any, int | None] | Response:
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

    async def _set_lifetime(
        self, sandbox: E2bSandbox, timeout: int, end_action: str | None = None
    ) -> Response | None:
        """The session's lifetime, set by the core (``session set_timeout``): None when done."""
        try:
            await self.orchestrator.set_timeout(
                sandbox.session_id, timeout, tenant=sandbox.tenant, end_action=end_action
            )
        except OrchestratorError as exc:
            return refusal(exc)
        return None

    async def _create_from(
        self, tenant: str, policy: str, image: str, envs: dict[str, str], metadata: Any
    ) -> dict[str, Any]:
        """A session of ``policy`` made from a template build's ``image`` (the build is the
        caller's: ``build_image`` looked it up by tenant); a refusal as a tool's would be."""
        try:
            session = await self.orchestrator.create_session(
                tenant=tenant, policy=policy, env=envs or None, metadata=metadata or None,
                image=image,
            )  # fmt: skip
        except OrchestratorError as exc:
            raise ToolCallError(exc.code, str(exc)) from None
        return {"session_id": session.id}

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

    def listed(self, sandbox: E2bSandbox, life: Life) -> dict[str, Any]:
        return {
            "templateID": sandbox.template,
            "sandboxID": sandbox.sandbox_id,
            "clientID": CLIENT_ID,
            "startedAt": _iso(sandbox.started_at),
            "endAt": _iso(life.ends_at),
            "cpuCount": _CPU,
            "memoryMB": _MEMORY_MB,
            "diskSizeMB": _DISK_MB,
            "state": "paused" if life.paused else "running",
            "envdVersion": ENVD_VERSION,
            "metadata": life.metadata,
            "lifecycle": {"autoResume": sandbox.auto_resume, "onTimeout": life.on_timeout},
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
        # One of the caller's template builds: the base template's policy over the build's image.
        image = self.build_image(tenant, template) if policy is None else None
        if image is not None:
            policy = TEMPLATES["base"]
        # One of the caller's snapshots as the template: a session made from it (``_snapshots``).
        snapshot = (
            await snapshot_template(self.orchestrator, tenant, template) if policy is None else None
        )
        if snapshot is not None:
            policy = snapshot.policy
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
            if image is not None:  # no tool takes an image: the core, as for a tool's create
                created = await self._create_from(tenant, policy, image, envs, metadata)
            else:
                created = await call(
                    self.orchestrator,
                    tenant,
                    "session",
                    "create",
                    policy=policy,
                    env=envs or None,
                    metadata=metadata or None,
                    snapshot=snapshot.snapshot_id if snapshot is not None else None,
                )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        # What E2B's create asks of the new session beyond sandhold's own create (its network
        # options; templates and builds hook in here too): each answers None or its refusal,
        # having destroyed the session.
        refused = await apply_network(
            self.orchestrator, tenant, created["session_id"], policy, body
        )
        if refused is not None:
            return refused
        resume = body.get("autoResume")
        sandbox = E2bSandbox(
            sandbox_id=self.table.new_id(),
            tenant=tenant,
            session_id=created["session_id"],
            template=template,
            policy=policy,
            access_token=secrets.token_urlsafe(32),
            envs=dict(envs),
            started_at=utc_now(),
            auto_resume=isinstance(resume, dict) and resume.get("enabled") is True,
        )
        end_action = "pause" if body.get("autoPause") is True else "end"
        refused = await self._set_lifetime(sandbox, timeout, end_action)
        # Started once its end is set, so the end is never more than the timeout after it.
        sandbox.started_at = utc_now()
        if refused is None:
            try:
                self.table.add(sandbox)
            except OrchestratorError as exc:
                refused = refusal(exc)
        if refused is not None:
            with contextlib.suppress(ToolCallError):
                await call(
                    self.orchestrator,
                    tenant,
                    "python_repl",
                    "destroy",
                    session_id=sandbox.session_id,
                )
            return refused
        return self.created(sandbox)

    async def list_running(self, request: Request) -> Response:
        """E2B's v1 listing: running sandboxes only, unpaginated (at most ``MAX_LIST_LIMIT``)."""
        return await self._list(request, default_states="running")

    async def list(self, request: Request) -> Response:
        return await self._list(request, default_states="running,paused")

    async def _list(self, request: Request, *, default_states: str) -> Response:
        """Newest first (``order=asc``: oldest first), filtered by ``state``, ``metadata``,
        ``template`` and ``startedAfter`` (inclusive, as E2B's), a page of ``limit`` from after
        ``nextToken``."""
        tenant = self.tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        query = request.query_params
        try:
            limit = _list_limit(query.get("limit"))
            after = _from_token(query.get("nextToken"))
            since = _started_after(query.get("startedAfter"))
            descending = _descending(query.get("order"))
        except InvalidArgumentError as exc:
            return e2b_error(400, f"invalid_argument: {exc}")
        wanted = _metadata_filter(query.get("metadata"))
        allowed = set((query.get("state") or default_states).split(","))
        template = query.get("template")
        chosen: builtins.list[tuple[E2bSandbox, Life]] = []
        for sandbox in self.table.listed(tenant):
            session = self.session_of(sandbox)
            if session is None:
                continue
            life = life_of(session)
            state = "paused" if life.paused else "running"
            if (
                state in allowed
                and not (template and sandbox.template != template)
                and all(life.metadata.get(k) == v for k, v in wanted.items())
                and (since is None or sandbox.started_at >= since)
            ):
                chosen.append((sandbox, life))
        chosen.sort(key=lambda pair: _place(pair[0]), reverse=descending)
        if after is not None:
            chosen = [
                p for p in chosen if (_place(p[0]) < after if descending else _place(p[0]) > after)
            ]
        page = chosen[:limit]
        headers = {NEXT_TOKEN_HEADER: _token(page[-1][0])} if len(chosen) > limit else {}
        return JSONResponse([self.listed(s, life) for s, life in page], headers=headers)

    async def get(self, request: Request) -> Response:
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        _, sandbox, session = found
        detail = self.listed(sandbox, life_of(session)) | {
            "envdAccessToken": sandbox.access_token,
            "trafficAccessToken": sandbox.access_token,
            "domain": None,
        }
        return JSONResponse(detail)

    async def kill(self, request: Request) -> Response:
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        tenant, sandbox, _ = found
        try:
            await call(
                self.orchestrator, tenant, "python_repl", "destroy", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        self.table.remove(sandbox.sandbox_id)
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        found = await self._sandbox_and_timeout(request, required=True)
        if isinstance(found, Response):
            return found
        _, sandbox, _, timeout = found
        assert timeout is not None  # required: checked
        refused = await self._set_lifetime(sandbox, timeout)
        return refused or Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        found = await self._sandbox_and_timeout(request, required=False)
        if isinstance(found, Response):
            return found
        tenant, sandbox, session, timeout = found
        if session.paused:
            return await self._resume(tenant, sandbox, timeout)
        life = life_of(session)
        left = (life.ends_at - utc_now()).total_seconds()
        # Connecting never shortens a running sandbox's life, as in E2B.
        if timeout is not None and timeout > left:
            refused = await self._set_lifetime(sandbox, timeout)
            if refused is not None:
                return refused
        return self.created(sandbox, status=200)

    async def pause(self, request: Request) -> Response:
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        tenant, sandbox, session = found
        if session.paused:
            return e2b_error(409, f"sandbox {sandbox.sandbox_id!r} is already paused")
        try:
            await call(self.orchestrator, tenant, "session", "pause", session_id=sandbox.session_id)
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        return Response(status_code=204)

    async def resume(self, request: Request) -> Response:
        found = await self._sandbox_and_timeout(request, required=False)
        if isinstance(found, Response):
            return found
        tenant, sandbox, session, timeout = found
        if not session.paused:
            return e2b_error(409, f"sandbox {sandbox.sandbox_id!r} is not paused")
        return await self._resume(tenant, sandbox, timeout)

    async def _resume(self, tenant: str, sandbox: E2bSandbox, timeout: int | None) -> Response:
        """The session resumed by the core, which gives it its last lifetime again from now
        (its clock stood still while it was paused); the one asked for instead, when given."""
        try:
            await call(
                self.orchestrator, tenant, "session", "resume", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        if timeout is not None:
            refused = await self._set_lifetime(sandbox, timeout)
            if refused is not None:
                return refused
        return self.created(sandbox)

    async def metrics(self, request: Request) -> Response:
        """One entry, sampled now, from the session's ``metrics`` (its container's cgroup usage
        as the engine reports it). E2B keeps a history; sandhold samples when asked, so the list
        holds the present only. CPU is a rate between two samples: 0 on a sandbox's first."""
        found = await self._sandbox(request)
        if isinstance(found, Response):
            return found
        tenant, sandbox, _ = found
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
    # E2B's "keep memory" (true: a full pause) or not (filesystem only): a frozen container
    # keeps its memory either way, which is at least what was asked.
    if not isinstance(body.get("autoPauseMemory", True), bool):
        return "autoPauseMemory must be true or false"
    resume = body.get("autoResume")
    if resume is not None and not (
        isinstance(resume, dict) and isinstance(resume.get("enabled", False), bool)
    ):
        return "autoResume must be an object with enabled true or false"
    return _check_timeout(timeout)


def _list_limit(raw: str | None) -> int:
    if raw is None:
        return MAX_LIST_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise InvalidArgumentError(f"limit must be a whole number from 1 to {MAX_LIST_LIMIT}")
    return int(raw)


def _started_after(raw: str | None) -> datetime.datetime | None:
    if not raw:
        return None
    try:
        moment = datetime.datetime.fromisoformat(raw[:64].replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgumentError("startedAfter must be an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _descending(raw: str | None) -> bool:
    if raw in (None, "", "desc"):
        return True
    if raw == "asc":
        return False
    raise InvalidArgumentError("order must be asc or desc")


def _place(sandbox: E2bSandbox) -> tuple[str, str]:
    """Where a sandbox stands in a listing: by start (to the microsecond, so the text sorts as
    the time does), then id (unique)."""
    return sandbox.started_at.strftime("%Y-%m-%dT%H:%M:%S.%f"), sandbox.sandbox_id


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
