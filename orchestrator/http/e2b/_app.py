"""The ASGI application ``sandhold serve --e2b-port`` serves: E2B's control API and every
sandbox's data plane on one port, told apart as E2B's SDK tells them apart when
``E2B_SANDBOX_URL`` is set: a data-plane request names its sandbox in ``E2b-Sandbox-Id`` and
the port in ``E2b-Sandbox-Port`` (49983 envd: process and filesystem RPCs, ``/files``,
``/health``; 49999 the code interpreter), and carries the sandbox's ``X-Access-Token``.

Invariants: a data-plane request reaches a service only with the access token of a sandbox
this server made; otherwise it is answered as E2B's proxy answers for a sandbox it cannot find,
whatever the reason. The timeout reaper ends each running sandbox whose lifetime ran out (its
session destroyed through the tool layer), or pauses it when it was made with ``autoPause``,
within ``REAP_INTERVAL``; a paused sandbox's clock stands still until it is resumed."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Final

import anyio
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from orchestrator._core.tenants import TenantKeys
from orchestrator.http import MAX_BODY_BYTES, Front, FrontDoor, HttpLimitsConfig
from orchestrator.http.e2b._codec import ENVD_JSON_CODEC
from orchestrator.http.e2b._context import sandbox_scope
from orchestrator.http.e2b._control import Control
from orchestrator.http.e2b._envd import filesystem_connect, process_connect
from orchestrator.http.e2b._envd_http import envd_http
from orchestrator.http.e2b._filesystem import FilesystemService
from orchestrator.http.e2b._interpreter import Interpreter
from orchestrator.http.e2b._process import ProcessService
from orchestrator.http.e2b._sandboxes import E2bSandbox, SandboxTable, utc_now
from orchestrator.http.e2b._surface import ENVD_PORT, INTERPRETER_PORT, E2bSurface
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["ENVD_PORT", "INTERPRETER_PORT", "E2bApp", "build_e2b_app"]

log = logging.getLogger(__name__)
# How often lifetimes are checked: a sandbox ends at most this long after its end time.
REAP_INTERVAL: Final = 1.0


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
        self.control = Starlette(routes=Control(orchestrator, self.table).routes())
        process: Any = ProcessService(orchestrator)
        filesystem: Any = FilesystemService(orchestrator)
        # Message compression is refused at the door (415); the door already bounds bodies.
        rpc: dict[str, Any] = {
            "codecs": [ENVD_JSON_CODEC],
            "compressions": (),
            "read_max_bytes": MAX_BODY_BYTES,
        }
        self.process = process_connect.ProcessASGIApplication(process, **rpc)
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
        if sandbox is None:
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
        async with anyio.create_task_group() as group:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    group.start_soon(self._reap)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    group.cancel_scope.cancel()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _reap(self) -> None:
        while True:
            await anyio.sleep(REAP_INTERVAL)
            for sandbox in self.table.expired(utc_now()):
                await self._expire(sandbox)

    async def _expire(self, sandbox: E2bSandbox) -> None:
        """Paused when it was made with ``autoPause`` (and a pause works), else ended."""
        if sandbox.auto_pause:
            try:
                await call(
                    self.orchestrator,
                    sandbox.tenant,
                    "session",
                    "pause",
                    session_id=sandbox.session_id,
                )
            except ToolCallError as exc:
                log.warning("e2b sandbox %s not paused (%s): ending it", sandbox.sandbox_id, exc)
            else:
                sandbox.state = "paused"
                log.info("e2b sandbox %s paused: its timeout ran out", sandbox.sandbox_id)
                return
        self.table.remove(sandbox.sandbox_id)
        with contextlib.suppress(ToolCallError):
            await call(
                self.orchestrator,
                sandbox.tenant,
                "python_repl",
                "destroy",
                session_id=sandbox.session_id,
            )
        log.info("e2b sandbox %s ended: its timeout ran out", sandbox.sandbox_id)


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
    table = SandboxTable()
    return front.door(E2bSurface(table), E2bApp(orchestrator, table))
