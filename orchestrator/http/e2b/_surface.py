"""The E2B port's surface for the front door (``orchestrator.http``): what is E2B's own about
who a request is from, which requests are streams or JSON, and how a refusal reads.

- **Who**: a control-plane request carries a tenant's key (``X-API-Key``, or ``Authorization:
  Bearer``); a data-plane request names its sandbox (``E2b-Sandbox-Id``) and carries that
  sandbox's ``X-Access-Token``, which names the sandbox's tenant. A wrong token costs the
  client's address from the same budget as a wrong key, and is answered as E2B's proxy answers
  for a sandbox it cannot find (502), whatever the reason.
- **Streams**: envd's server-streaming RPCs (a command's ``Start`` and ``Connect``, ``WatchDir``)
  and the interpreter's ``/execute`` count against the tenant's streams with every other
  surface's.
- **Bodies**: control and interpreter bodies are JSON; envd's Connect RPCs are JSON when their
  content type says so (enveloped in the streaming protocol); ``/files`` is the file's bytes.
- **Refusals**: E2B's ``{code, message}`` body (and our ``error_type``), the status from
  ``E2B_STATUS``.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.types import Scope

from orchestrator._core import TenantKeys
from orchestrator.http import E2B_STATUS, Caller, JsonBody, Role, Surface
from orchestrator.http.e2b._sandboxes import SandboxTable
from orchestrator.http.e2b._signed import as_sandbox_request
from orchestrator.http.e2b._templates import UPLOAD_PREFIX, upload_tenant

__all__ = ["ENVD_PORT", "INTERPRETER_PORT", "STREAMING_RPCS", "E2bSurface", "header"]

ENVD_PORT: Final = "49983"
INTERPRETER_PORT: Final = "49999"
STREAMING_RPCS: Final = frozenset(
    {"/process.Process/Start", "/process.Process/Connect", "/filesystem.Filesystem/WatchDir"}
)


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class E2bSurface(Surface):
    name = "e2b"
    statuses = E2B_STATUS

    def __init__(self, table: SandboxTable, **options: Any) -> None:
        super().__init__(**options)
        self.table = table

    def role(self, scope: Scope) -> Role:
        return Role.TENANT

    def credential(self, scope: Scope, keys: TenantKeys) -> tuple[Caller | None, bool]:
        sandbox_id = header(scope, b"e2b-sandbox-id")
        if sandbox_id is None:
            # A template build's upload URL is its own credential (``_templates``).
            uploader = upload_tenant(str(scope.get("path", "")))
            if uploader is not None:
                return Caller(uploader, uploader), True
            # A signed file URL names its sandbox by its signature alone (``_signed``).
            tenants = (s for tenant in keys.tenants for s in self.table.listed(tenant))
            signed = as_sandbox_request(scope, tenants)
            if signed is not None:
                return Caller(signed.tenant, signed.tenant), True
            return super().credential(scope, keys)
        # The code interpreter SDK's context calls send only the traffic token (the same one).
        token = header(scope, b"x-access-token") or header(scope, b"e2b-traffic-access-token")
        sandbox = self.table.with_token(sandbox_id, token)
        if sandbox is None:
            return None, token is not None
        return Caller(sandbox.tenant, sandbox.tenant), True

    def is_stream(self, scope: Scope) -> bool:
        if header(scope, b"e2b-sandbox-id") is None:
            return False
        port = header(scope, b"e2b-sandbox-port") or ENVD_PORT
        if port == INTERPRETER_PORT:
            return str(scope["path"]) == "/execute"
        return str(scope["path"]) in STREAMING_RPCS

    def json_body(self, scope: Scope) -> JsonBody:
        if str(scope.get("path", "")).startswith(UPLOAD_PREFIX):
            return JsonBody.NO  # a template build's files: a tar
        if header(scope, b"e2b-sandbox-id") is None:
            return JsonBody.PLAIN
        if (header(scope, b"e2b-sandbox-port") or ENVD_PORT) == INTERPRETER_PORT:
            return JsonBody.PLAIN
        content_type = (header(scope, b"content-type") or "").lower()
        if content_type.startswith("application/connect+json"):
            return JsonBody.ENVELOPED
        if content_type.startswith("application/json"):
            return JsonBody.PLAIN
        return JsonBody.NO

    def refusal(
        self, scope: Scope, status: int, error: dict[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
        message = f"{error.get('error_type')}: {error.get('error_message')}"
        return {"code": status, "message": message, **error}, []

    def unauthenticated(
        self, scope: Scope, *, key_given: bool
    ) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
        sandbox_id = header(scope, b"e2b-sandbox-id")
        if sandbox_id is not None:
            message = f"The sandbox {sandbox_id[:64]} was not found"
            return 502, {"code": 502, "message": message}, []
        body = {"code": 401, "message": "Invalid API key", "error_type": "unauthenticated"}
        return 401, body, []
