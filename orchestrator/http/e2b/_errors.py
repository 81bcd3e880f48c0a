"""How a refused tool call reads to an E2B client: an HTTP status with E2B's ``{code,
message}`` body on the control API, the envd file routes and the interpreter, a Connect code on
the RPCs; both from the front door's tables (``orchestrator.http``: ``E2B_STATUS``,
``CONNECT_CODES``), by ``error_type`` only. The SDK picks its exception class from the status
(404 ``NotFoundException``, 401 ``AuthenticationException``, 429 ``RateLimitException``, 502
with "was not found" ``SandboxNotRunningException``)."""

from __future__ import annotations

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from starlette.responses import JSONResponse

from orchestrator.http import CONNECT_CODES, E2B_STATUS
from orchestrator.http.e2b._tooling import ToolCallError

__all__ = [
    "connect_error",
    "e2b_error",
    "is_not_found",
    "sandbox_gone",
    "status_of",
]

NOT_FOUND_TYPES = frozenset({"session_not_found", "session_lost", "path_not_found"})


def is_not_found(error: ToolCallError) -> bool:
    return error.error_type in NOT_FOUND_TYPES


def status_of(error: ToolCallError) -> int:
    return E2B_STATUS.get(error.error_type, 500)


def e2b_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def sandbox_gone(sandbox_id: str) -> JSONResponse:
    """What E2B's proxy answers for a sandbox it cannot find (the SDK's
    ``SandboxNotRunningException``): the same for an unknown id, another tenant's and a wrong
    access token."""
    return e2b_error(502, f"The sandbox {sandbox_id} was not found")


def connect_error(error: ToolCallError) -> ConnectError:
    code = Code(CONNECT_CODES.get(error.error_type, "internal"))
    return ConnectError(code, f"{error.error_type}: {error.message}")
