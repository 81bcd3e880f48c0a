"""E2B's snapshots and forks onto the core's (``orchestrator._core.snapshots``, docs/snapshots.md):
``POST /sandboxes/{id}/snapshots`` is ``session snapshot``, ``GET /snapshots`` is ``session
snapshots``, ``DELETE /templates/{snapshot}`` (the SDK's ``delete_snapshot``) is ``session
delete_snapshot``, a sandbox created with a snapshot id as its ``templateID`` is ``session
create`` with ``snapshot`` (``_control``), and ``POST /sandboxes/{id}/fork`` is one snapshot, a
sandbox made from it per fork asked for, and the snapshot deleted (the core's fork, ``count``
times over one snapshot).

Ids: E2B names a snapshot as a template with its tag; here that is the core's id with the tag
``default`` (``snap-<32 hex>:default``); the bare core id is taken as well.

What a snapshot keeps is the core's: the files, the policy, env and metadata, never a
process's memory. E2B's ``memory: false`` (a filesystem-only snapshot) is exactly that; a full
one (``memory`` true or left out, E2B's default) is taken the same way, and the answer says so
(``replState: "fresh"``): a sandbox made from it starts a fresh interpreter and no process.

Invariants: every call goes through the tool layer as the request's tenant, so owners, quotas
(``snapshots``, ``snapshots_mb``), audit and errors are the core's, and a refusal's status is
the front door's ``E2B_STATUS``; another tenant's snapshot answers as an unknown one. The E2B
name of a snapshot and the sandbox it was taken from are this server's memory only (as template
builds are): the snapshot itself, its id and its files survive a restart; its name does not."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.errors import OrchestratorError
from orchestrator.http import CALLER_SCOPE_KEY, Caller
from orchestrator.http.e2b._errors import e2b_error, status_of
from orchestrator.http.e2b._sandboxes import SandboxTable
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["E2bSnapshots", "SnapshotTemplate", "snapshot_template"]

TAG: Final = "default"
_CORE_ID: Final = re.compile(r"snap-[0-9a-f]{32}")
# E2B's own bounds: forks per request (the SDK checks it too) and a listing's page.
MAX_FORKS: Final = 20
MAX_LIST_LIMIT: Final = 100
# A fork's lifetime when none is asked for: E2B's API default.
FORK_TIMEOUT_S: Final = 15
MAX_NAME_CHARS: Final = 128
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NEXT_TOKEN_HEADER: Final = "x-next-token"  # noqa: S105 (a header's name)

# Makes a sandbox from a create body for a tenant, as ``Control._create`` does.
Create = Callable[[str, dict[str, Any]], Awaitable[Response]]


def e2b_id(core_id: str) -> str:
    return f"{core_id}:{TAG}"


def core_id(template: str) -> str | None:
    """The core's snapshot id a template name stands for: ``snap-<hex>`` with or without
    the ``default`` tag; None when it has not that shape."""
    name, _, tag = template.partition(":")
    return name if _CORE_ID.fullmatch(name) and tag in ("", TAG) else None


@dataclasses.dataclass(frozen=True)
class SnapshotTemplate:
    """A ``templateID`` that is one of the caller's snapshots: its core id and policy."""

    snapshot_id: str
    policy: str


async def snapshot_template(
    orchestrator: Any, tenant: str, template: str
) -> SnapshotTemplate | None:
    """The caller's snapshot ``template`` names, or None (not a snapshot id, another tenant's,
    deleted: alike)."""
    wanted = core_id(template)
    if wanted is None:
        return None
    for snapshot in await _snapshots(orchestrator, tenant):
        if snapshot["snapshot_id"] == wanted:
            return SnapshotTemplate(wanted, str(snapshot["policy"]))
    return None


async def _snapshots(orchestrator: Any, tenant: str) -> list[dict[str, Any]]:
    listed = await call(orchestrator, tenant, "session", "snapshots")
    return list(listed.get("snapshots") or [])


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What E2B says of a snapshot and the core does not keep."""

    name: str | None
    sandbox_id: str


class E2bSnapshots:
    def __init__(self, orchestrator: Any, table: SandboxTable, create: Create) -> None:
        self.orchestrator = orchestrator
        self.table = table
        self.create = create
        self._facts: dict[str, _Facts] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes/{sandbox_id}/snapshots", self.take, methods=["POST"]),
            Route("/snapshots", self.list, methods=["GET"]),
            Route("/templates/{template_id}", self.delete, methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/fork", self.fork, methods=["POST"]),
        ]

    # -- helpers
    def _tenant(self, request: Request) -> str | None:
        caller = request.scope.get(CALLER_SCOPE_KEY)
        return caller.tenant if isinstance(caller, Caller) else None

    async def _body(self, request: Request) -> dict[str, Any] | None:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _info(self, tenant: str, snapshot: dict[str, Any]) -> dict[str, Any]:
        snapshot_id = str(snapshot["snapshot_id"])
        facts = self._facts.get(snapshot_id)
        named = facts.name if facts is not None and facts.name else snapshot_id
        return {
            "snapshotID": e2b_id(snapshot_id),
            "names": [f"{tenant}/{named}:{TAG}"],
            "replState": snapshot.get("repl_state"),
            "keeps": snapshot.get("keeps"),
            "createdAt": snapshot.get("created_at"),
            "sizeBytes": snapshot.get("size_bytes"),
        }

    def _source_of(self, tenant: str, snapshot: dict[str, Any]) -> str | None:
        """The E2B sandbox a snapshot was taken from: as remembered, or the live sandbox whose
        session it was (after a restart)."""
        facts = self._facts.get(str(snapshot["snapshot_id"]))
        if facts is not None:
            return facts.sandbox_id
        source = snapshot.get("source_session")
        found = (s for s in self.table.listed(tenant) if s.session_id == source)
        return next((s.sandbox_id for s in found), None)

    # -- routes
    async def take(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        sandbox_id = request.path_params["sandbox_id"]
        sandbox = self.table.of_tenant(sandbox_id, tenant)
        if sandbox is None:
            return e2b_error(404, f"sandbox {sandbox_id!r} not found")
        body = await self._body(request)
        if body is None:
            return e2b_error(400, "the body is not a JSON object")
        name, memory = body.get("name"), body.get("memory", True)
        if not isinstance(memory, bool):
            return e2b_error(400, "memory must be true or false")
        if name is not None and not (
            isinstance(name, str) and len(name) <= MAX_NAME_CHARS and _NAME.fullmatch(name)
        ):
            return e2b_error(
                400, f"name must be 1 to {MAX_NAME_CHARS} letters, digits, '.', '_' or '-'"
            )
        try:
            taken = await call(
                self.orchestrator, tenant, "session", "snapshot", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            if exc.error_type == "session_not_found":
                return e2b_error(404, f"sandbox {sandbox_id!r} not found")
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        self._facts[str(taken["snapshot_id"])] = _Facts(name, sandbox_id)
        return JSONResponse(self._info(tenant, taken), status_code=201)

    async def list(self, request: Request) -> Response:
        """The caller's snapshots, oldest first, filtered by ``sandboxID`` and ``name``, a page
        of ``limit`` after ``nextToken`` (the last snapshot id of the page before)."""
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        query = request.query_params
        raw_limit = query.get("limit") or str(MAX_LIST_LIMIT)
        if not (raw_limit.isascii() and raw_limit.isdigit()) or not (
            1 <= int(raw_limit) <= MAX_LIST_LIMIT
        ):
            return e2b_error(400, f"limit must be a whole number from 1 to {MAX_LIST_LIMIT}")
        limit, after = int(raw_limit), query.get("nextToken")
        sandbox_id, name = query.get("sandboxID"), query.get("name")
        try:
            snapshots = await _snapshots(self.orchestrator, tenant)
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        chosen = []
        for snapshot in snapshots:
            facts = self._facts.get(str(snapshot["snapshot_id"]))
            if name and (facts is None or facts.name != name):
                continue
            if sandbox_id and self._source_of(tenant, snapshot) != sandbox_id:
                continue
            chosen.append(snapshot)
        if after:
            ids = [e2b_id(str(s["snapshot_id"])) for s in chosen]
            chosen = chosen[ids.index(after) + 1 :] if after in ids else []
        page = chosen[:limit]
        headers = (
            {NEXT_TOKEN_HEADER: e2b_id(page[-1]["snapshot_id"])} if len(chosen) > limit else {}
        )
        return JSONResponse([self._info(tenant, s) for s in page], headers=headers)

    async def delete(self, request: Request) -> Response:
        """The SDK's ``delete_snapshot``: 204, or 404 for a snapshot the caller has not (the SDK
        then answers False). Deleting a template that is no snapshot is not offered."""
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        template = request.path_params["template_id"]
        wanted = core_id(template)
        if wanted is None:
            return e2b_error(501, f"deleting template {template[:64]!r}: not supported by sandhold")
        try:
            await call(self.orchestrator, tenant, "session", "delete_snapshot", snapshot=wanted)
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        self._facts.pop(wanted, None)
        return Response(status_code=204)

    async def fork(self, request: Request) -> Response:
        """``count`` new sandboxes from one snapshot of a running sandbox (which goes on), each
        made as ``Sandbox.create`` from that snapshot makes one; each answered in its own entry,
        a sandbox or the refusal that stopped it. The snapshot is deleted once they exist."""
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        sandbox_id = request.path_params["sandbox_id"]
        sandbox = self.table.of_tenant(sandbox_id, tenant)
        body = await self._body(request)
        if sandbox is None:
            return e2b_error(404, f"sandbox {sandbox_id!r} not found")
        if body is None:
            return e2b_error(400, "the body is not a JSON object")
        count, timeout = body.get("count", 1), body.get("timeout", FORK_TIMEOUT_S)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            return e2b_error(400, f"count must be an integer between 1 and {MAX_FORKS}")
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            return e2b_error(400, "timeout must be a whole number of seconds")
        try:
            session = self.orchestrator.find_session(sandbox.session_id, tenant=tenant)
            paused = bool(session.paused)
        except OrchestratorError:  # its session ended: the sandbox is gone
            return e2b_error(404, f"sandbox {sandbox_id!r} not found")
        if paused:
            return e2b_error(409, f"sandbox {sandbox_id!r} is paused: connect to it, then fork")
        try:
            taken = await call(
                self.orchestrator, tenant, "session", "snapshot", session_id=sandbox.session_id
            )
        except ToolCallError as exc:
            if exc.error_type == "session_not_found":
                return e2b_error(404, f"sandbox {sandbox_id!r} not found")
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        made: dict[str, Any] = dict(templateID=e2b_id(str(taken["snapshot_id"])), timeout=timeout)
        if sandbox.envs:
            made["envVars"] = dict(sandbox.envs)
        results: list[dict[str, Any]] = []
        try:
            for _ in range(count):
                answer = await self.create(tenant, made)
                payload = json.loads(bytes(answer.body))
                key = "sandbox" if answer.status_code < 300 else "error"
                results.append({key: payload})
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(ToolCallError):
                # Failing, the core's sweep removes the image once no snapshot names it.
                await call(
                    self.orchestrator,
                    tenant,
                    "session",
                    "delete_snapshot",
                    snapshot=taken["snapshot_id"],
                )
        return JSONResponse(results, status_code=201)
