"""How a refused tool call reads to an E2B client: an HTTP status with E2B's ``{code,
message}`` body on the control API and the envd file routes, a Connect code on the RPCs.

The SDK picks its exception class from the status (404 ``NotFoundException``, 401
``AuthenticationException``, 429 ``RateLimitException``, 502 with "was not found"
``SandboxNotRunningException``), so each sandhold ``error_type`` is mapped to the status whose
exception means the same thing."""

from __future__ import annotations

from typing import Final

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from starlette.responses import JSONResponse

from orchestrator.e2b._tooling import ToolCallError

__all__ = [
    "connect_error",
    "e2b_error",
    "is_not_found",
    "sandbox_gone",
    "status_of",
]

_STATUS: Final = {
    "invalid_argument": 400,
    "unknown_template": 404,
    "template_not_built": 400,
    "session_not_found": 404,
    "session_lost": 404,
    "storage_full": 507,
    "policy": 403,
    "quota_exceeded": 429,
    "rate_limited": 429,
    "busy": 503,
    "timeout": 504,
    "unsupported": 501,
}
_CODE: Final = {
    400: Code.INVALID_ARGUMENT,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.ALREADY_EXISTS,
    429: Code.RESOURCE_EXHAUSTED,
    501: Code.UNIMPLEMENTED,
    502: Code.UNAVAILABLE,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}
# The files tool says so in its message; its error_type is invalid_argument.
_NOT_FOUND_TEXT: Final = ("no such file or directory", "does not exist", "not found")


def is_not_found(error: ToolCallError) -> bool:
    lowered = error.message.lower()
    return error.error_type in ("session_not_found", "session_lost") or any(t in lowered for t in _NOT_FOUND_TEXT)


def status_of(error: ToolCallError) -> int:
    if error.error_type == "invalid_argument" and is_not_found(error):
        return 404
    return _STATUS.get(error.error_type, 500)


def e2b_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def sandbox_gone(sandbox_id: str) -> JSONResponse:
    """What E2B's proxy answers for a sandbox it cannot find (the SDK's
    ``SandboxNotRunningException``): the same for an unknown id, another tenant's and a wrong
    access token."""
    return e2b_error(502, f"The sandbox {sandbox_id} was not found")


def connect_error(error: ToolCallError) -> ConnectError:
    status = status_of(error)
    return ConnectError(_CODE.get(status, Code.INTERNAL), f"{error.error_type}: {error.message}")
