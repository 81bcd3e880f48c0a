"""Every HTTP surface's table from our error codes (``orchestrator.errors``) to what it answers,
side by side: the one place a status is decided, by ``error_type`` (and, for the two refusals of
the body reader, by class), never by reading a message. A test walks the error tree and checks
that each table answers every code a call can fail with.

REST (``/v1``, ``/mcp``'s HTTP refusals, the ops routes) is the reference. E2B's control API, its
envd ``/files`` and its code interpreter answer E2B's statuses, which E2B's SDK turns into its
exceptions (404 ``NotFoundException``, 401 ``AuthenticationException``, 429
``RateLimitException``); they differ from REST's only where E2B's own API does (an unknown
template is E2B's 404). envd's Connect RPCs answer Connect codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from orchestrator.errors import BodyTooLargeError, OrchestratorError, UnsupportedEncodingError

__all__ = [
    "BY_CLASS",
    "CONNECT_CODES",
    "E2B_STATUS",
    "HTTP_ONLY_STATUS",
    "RATE_LIMITED",
    "REST_STATUS",
    "UNAUTHENTICATED",
    "status_for",
]

# Not tool layer error types: the request never reached a tool.
UNAUTHENTICATED: Final = "unauthenticated"
RATE_LIMITED: Final = "rate_limited"

# Failures of the request itself. Any other error_type (an exception raised by the user's code,
# timeout, validation, import_blocked, process_crashed, output_limit) is the tool's answer about
# the work, and comes with 200 like a success.
REST_STATUS: Final[Mapping[str, int]] = {
    "invalid_argument": 400,
    "unknown_template": 400,
    "path_not_found": 404,
    "policy": 403,
    "session_not_found": 404,
    # Gone: the session existed and ended without being asked to (its container died).
    "session_lost": 410,
    "busy": 409,
    "quota_exceeded": 429,
    "internal": 500,
    "backend_unavailable": 503,
    "template_not_built": 503,
    # Not Implemented: the backend in use cannot do this (another backend may).
    "not_supported": 501,
    # Insufficient Storage: the server's own data directory is full.
    "storage_full": 507,
}
# Answered by the front door before any route, on every surface alike.
HTTP_ONLY_STATUS: Final[Mapping[str, int]] = {UNAUTHENTICATED: 401, RATE_LIMITED: 429}

E2B_STATUS: Final[Mapping[str, int]] = {
    **REST_STATUS,
    **HTTP_ONLY_STATUS,
    # E2B's API answers a template it does not have 404 (the SDK's NotFoundException).
    "unknown_template": 404,
    # A lost sandbox is one E2B's SDK cannot find any more (its NotFoundException).
    "session_lost": 404,
    # A file operation or command that ran out of time: E2B's gateway timeout, which the SDK
    # raises as its TimeoutException (REST answers it 200, a result about the work).
    "timeout": 504,
}

# Connect's codes (the names of the Connect protocol), for envd's RPCs.
CONNECT_CODES: Final[Mapping[str, str]] = {
    "invalid_argument": "invalid_argument",
    "unknown_template": "not_found",
    "path_not_found": "not_found",
    "policy": "permission_denied",
    "session_not_found": "not_found",
    "session_lost": "not_found",
    "busy": "unavailable",
    "quota_exceeded": "resource_exhausted",
    "internal": "internal",
    "backend_unavailable": "unavailable",
    "template_not_built": "unavailable",
    "not_supported": "unimplemented",
    "storage_full": "resource_exhausted",
    "timeout": "deadline_exceeded",
    UNAUTHENTICATED: "unauthenticated",
    RATE_LIMITED: "resource_exhausted",
}

# The body reader's refusals: argument errors (``invalid_argument``) with statuses of their own
# on every HTTP surface.
BY_CLASS: Final[Mapping[type[OrchestratorError], int]] = {
    BodyTooLargeError: 413,
    UnsupportedEncodingError: 415,
}


def status_for(error: OrchestratorError, table: Mapping[str, int]) -> int:
    """The status ``table``'s surface answers ``error`` with."""
    for cls, status in BY_CLASS.items():
        if isinstance(error, cls):
            return status
    return table.get(error.code) or HTTP_ONLY_STATUS.get(error.code, 500)
