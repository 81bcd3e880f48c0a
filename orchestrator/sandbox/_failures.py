"""A refused call, raised: the structured result of a call that failed as a call (not a cell
that raised, which is data in its ``Execution``) becomes the exception of the error tree its
``error_type`` names. Each keeps the ``error_type`` it came with (``unauthenticated`` from a
server that refused the key has no class of its own: it is an ``OrchestratorError``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.errors import (
    BackendUnavailableError,
    BusyError,
    InvalidArgumentError,
    NotSupportedError,
    OrchestratorError,
    PathNotFoundError,
    PolicyViolationError,
    ProcessCrashedError,
    QuotaExceededError,
    SessionLostError,
    SessionNotFoundError,
    TemplateNotBuiltError,
    UnknownTemplateError,
)
from orchestrator.tools import ToolResult

__all__ = ["check", "raised"]


def _bare(cls: type[OrchestratorError]) -> Callable[[str, dict[str, Any]], OrchestratorError]:
    """For a class whose constructor wants what only the server knew (a template's name and
    the names it knows): the class and the message, without its extra fields."""

    def make(message: str, structured: dict[str, Any]) -> OrchestratorError:
        error = cls.__new__(cls)
        OrchestratorError.__init__(error, message)
        return error

    return make


_BY_TYPE: dict[str, Callable[[str, dict[str, Any]], OrchestratorError]] = {
    "invalid_argument": lambda m, s: InvalidArgumentError(m),
    "unknown_template": _bare(UnknownTemplateError),
    "path_not_found": lambda m, s: PathNotFoundError(m),
    "session_not_found": lambda m, s: SessionNotFoundError(m),
    "session_lost": lambda m, s: SessionLostError(m, cause=str(s.get("cause", "unknown"))),
    "policy": lambda m, s: PolicyViolationError(m, rule=str(s.get("rule", ""))),
    "quota_exceeded": lambda m, s: QuotaExceededError(m, quota=s.get("quota")),
    "busy": lambda m, s: BusyError(m),
    "backend_unavailable": lambda m, s: BackendUnavailableError(m),
    "template_not_built": _bare(TemplateNotBuiltError),
    "not_supported": lambda m, s: NotSupportedError(m),
    "process_crashed": lambda m, s: ProcessCrashedError(m, cause=str(s.get("cause", "unknown"))),
}


def raised(structured: dict[str, Any]) -> OrchestratorError:
    """The exception for a failed call's structured result."""
    error_type = str(structured.get("error_type") or "internal")
    message = str(structured.get("error_message") or error_type)
    make = _BY_TYPE.get(error_type)
    error = make(message, structured) if make else OrchestratorError(message)
    error.error_type = error_type
    return error


def check(structured: dict[str, Any]) -> dict[str, Any]:
    """``structured`` when the call completed (whatever its work did); raised when it failed."""
    if ToolResult(structured, "").is_error:
        raise raised(structured)
    return structured
