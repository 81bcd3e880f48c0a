"""The ASGI application ``sandhold serve --e2b-port`` serves: E2B's control API and every
sandbox's data plane on one port, told apart as E2B's SDK tells them apart when
``E2B_SANDBOX_URL`` is set: a data-plane request names its sandbox in ``E2b-Sandbox-Id`` and
the port in ``E2b-Sandbox-Port`` (49983 envd: process and filesystem RPCs, ``/files``,
``/health``; 49999 the code interpreter), and carries the sandbox's ``X-Access-Token``.

Invariants: a data-plane request reaches a service only with the access token of a sandbox
this server made whose session lives; otherwise it is answered as E2B's proxy answers for a
sandbox it cannot find, whatever the reason. A paused sandbox is woken by a data-plane request
only when it was made with ``autoResume`` (the core's resume, which gives it its lifetime
again); without, the request is answered as for a sandbox that is not running, as E2B does,
until ``connect`` resumes it. Lifetimes, and pausing at their end, are the core's (its reaper);
this application has no clock of its own."""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from orchestrator._core import TenantKeys
from orchestrator.errors import OrchestratorError
from orchestrator.http import MAX_BODY_BYTES, Front, FrontDoor, HttpLimitsConfig
from orchestrator.http.e2b._codec import ENVD_JSON_CODEC
from orchestrator.http.e2b._context import sandbox_scope
from orchestrator.http.e2b._control import Control
from orchestrator.http.e2b._envd import filesystem_connect
from orchestrator.http.e2b._envd_http import envd_http
from orchestrator.http.e2b._filesystem import FilesystemService
from orchestrator.http.e2b._interpreter import Interpreter
from orchestrator.http.e2b._process import ProcessApplication, ProcessService
from orchestrator.http.e2b._sandboxes import E2bSandbox, SandboxTable
from orchestrator.http.e2b._snapshots import E2bSnapshots
from orchestrator.http.e2b._surface import ENVD_PORT, INTERPRETER_PORT, E2bSurface
from orchestrator.http.e2b._templates import TemplateBuilds

__all__ = ["ENVD_PORT", "INTERPRETER_PORT", "E2bApp", "build_e2b_app"]

log = logging.getLogger(__name__)


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class E2bApp:
    """Behind the front door (``build_e2b_app``): every request here has a caller (a tenant) and
    a bounded body."""

    def __init__(self, orchestrator: Any, table: SandboxTable) -> None:
        self.orchestrator = orchestrator
        self.table = table
        self.templates = TemplateBuilds(orchestrator)
        control = Control(orchestrator, self.table, self.templates.image_for)
        # A fork makes its sandboxes as a create from its snapshot does.
        snapshots = E2bSnapshots(orchestrator, self.table, control._create)
        self.control = Starlette(
            routes=[*self.templates.routes(), *snapshots.routes(), *control.routes()]
        )
        process: Any = ProcessService(orchestrator)
        filesystem: Any = FilesystemService(orchestrator)
        # Message compression is refused at the door (415); the door already bounds bodies.
        rpc: dict[str, Any] = {
            "codecs": [ENVD_JSON_CODEC],
            "compressions": (),
            "read_max_bytes": MAX_BODY_BYTES,
        }
        self.process = ProcessApplication(process, **rpc)
        self.filesystem = filesystem_connect.FilesystemASGIApplication(filesystem, **rpc)
        self.envd_http = envd_http(orchestrator)
        self.interpreter = Interpreter(orchestrator).app()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        sandbox_id = headers.get("e2b-sandbox-id")
        if sandbox_id is None:
            await self.control(scope, receive, send)
            return
        # The code interpreter SDK's context calls carry only the traffic token (the same one).
        token = headers.get("x-access-token") or headers.get("e2b-traffic-access-token")
        sandbox = self.table.with_token(sandbox_id, token)
        if sandbox is None or not await self._awake(sandbox):
            await _answer(
                send, 502, {"code": 502, "message": f"The sandbox {sandbox_id} was not found"}
            )
            return
        port = headers.get("e2b-sandbox-port", ENVD_PORT)
        sandbox_scope(sandbox)
        if port == INTERPRETER_PORT:
            await self.interpreter(scope, receive, send)
        elif port != ENVD_PORT:
            await _answer(
                send,
                502,
                {"code": 502, "message": f"The sandbox is running but port is not open: {port}"},
            )
        elif scope["path"].startswith(self.process.path):
            await self.process(scope, receive, send)
        elif scope["path"].startswith(self.filesystem.path):
            await self.filesystem(scope, receive, send)
        else:
            await self.envd_http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _awake(self, sandbox: E2bSandbox) -> bool:
        """Whether the sandbox's session lives and runs: a paused one is resumed (by the core)
        when the sandbox has ``autoResume``, else it is not running for its data plane (as in
        E2B), unless its policy pauses idle sessions (sandhold's own idle pause is invisible)."""
        try:
            session = self.orchestrator.find_session(sandbox.session_id, tenant=sandbox.tenant)
            if not session.paused:
                return True
            # A policy that pauses idle sessions pauses them out of sight: any call wakes them.
            if not sandbox.auto_resume and session.policy.timeouts.idle_action != "pause":
                return False
            await self.orchestrator.resume(sandbox.session_id, tenant=sandbox.tenant)
        except OrchestratorError as exc:
            log.info("e2b sandbox %s: its session is not there (%s)", sandbox.sandbox_id, exc)
            return False
        return True


def build_e2b_app(
    orchestrator: Any,
    keys: TenantKeys,
    *,
    front: Front | None = None,
    limits: HttpLimitsConfig | None = None,
) -> FrontDoor:
    """The E2B application over ``orchestrator``, for the tenants of ``keys``, behind ``front``
    (the one the server's other surfaces share; by default its own)."""
    if front is None:
        front = Front(
            keys, limits=limits, metrics=orchestrator.metrics, audit=lambda: orchestrator.audit_log
        )
    # The core's registry, read when used: ``start`` may swap it for a claimed one.
    table = SandboxTable(lambda: orchestrator._registry)
    return front.door(E2bSurface(table), E2bApp(orchestrator, table))
