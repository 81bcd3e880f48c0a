"""The error tree of sandhold. Every error carries a stable ``code``, the ``error_type`` every
interface reports; messages are for people and may change, codes may not.

    OrchestratorError                      internal
    ├── InvalidArgumentError               invalid_argument
    │   └── PolicyFileError                invalid_argument
    ├── SessionNotFoundError               session_not_found
    ├── PolicyViolationError               policy
    ├── QuotaExceededError                 quota_exceeded
    ├── BusyError                          busy
    ├── ExecutionError                     (code given per instance)
    │   ├── ValidationError                validation
    │   ├── ImportBlockedError             import_blocked
    │   ├── ExecutionTimeoutError          timeout
    │   ├── ProcessCrashedError            process_crashed
    │   └── OutputLimitError               output_limit
    ├── ImageError                         internal
    │   └── ImageToolMissingError          invalid_argument
    └── BackendError                       internal
        ├── BackendUnavailableError        backend_unavailable
        └── ContainerNotFoundError         internal

Errors raised by *user code* inside a sandbox are data in a result, never one of these.
"""

from __future__ import annotations

from typing import ClassVar, Final

__all__ = [
    "ERROR_TYPES",
    "BackendError",
    "BackendUnavailableError",
    "BusyError",
    "ContainerNotFoundError",
    "ExecutionError",
    "ExecutionTimeoutError",
    "ImageError",
    "ImageToolMissingError",
    "InvalidArgumentError",
    "OrchestratorError",
    "PolicyFileError",
    "PolicyViolationError",
    "ProcessCrashedError",
    "QuotaExceededError",
    "SessionNotFoundError",
]

ERROR_TYPES: Final = (
    "invalid_argument",
    "session_not_found",
    "validation",
    "import_blocked",
    "timeout",
    "process_crashed",
    "output_limit",
    "quota_exceeded",
    "policy",
    "busy",
    "backend_unavailable",
    "internal",
)


class OrchestratorError(Exception):
    """Root of every error sandhold raises on purpose."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, str]:
        """The ``error_type`` / ``error_message`` pair every interface shows."""
        return {"error_type": self.code, "error_message": str(self)}


class InvalidArgumentError(OrchestratorError):
    """An argument, file or setting given by the caller is malformed or out of bounds."""

    code = "invalid_argument"


class PolicyFileError(InvalidArgumentError):
    """A policy file cannot be read, parsed or validated; names the file, key and reason."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        super().__init__(f"{file}: {key}: {reason}")
        self.file = file
        self.key = key
        self.reason = reason


class SessionNotFoundError(OrchestratorError):
    """No session (or terminal, or process) with this id is visible to the caller."""

    code = "session_not_found"


class PolicyViolationError(OrchestratorError):
    """The policy in force forbids the requested action; names the rule."""

    code = "policy"

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "rule": self.rule}


class QuotaExceededError(OrchestratorError):
    """Granting the request would exceed a quota; names the quota."""

    code = "quota_exceeded"

    def __init__(self, message: str, *, quota: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.quota = quota or message.partition(":")[0]

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "quota": self.quota}


class BusyError(OrchestratorError):
    """The resource is in use and the caller chose (or ran out of time) not to wait."""

    code = "busy"


class ExecutionError(OrchestratorError):
    """Running something in a sandbox failed for a reason of the sandbox, not of the code."""


class ValidationError(ExecutionError):
    """Code was rejected before it ran; ``violations`` lists every reason."""

    code = "validation"

    def __init__(self, message: str, *, violations: list[str]) -> None:
        super().__init__(message)
        self.violations = violations


class ImportBlockedError(ValidationError):
    """Code tried to import a module the policy does not allow."""

    code = "import_blocked"


class ExecutionTimeoutError(ExecutionError):
    """The work did not finish within its timeout."""

    code = "timeout"


class ProcessCrashedError(ExecutionError):
    """The process serving the request died; ``cause`` says how (exit, signal, OOM)."""

    code = "process_crashed"

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class OutputLimitError(ExecutionError):
    """Output went past a limit that could not be met by truncation alone."""

    code = "output_limit"


class ImageError(OrchestratorError):
    """Building or finding the sandbox image failed."""


class ImageToolMissingError(ImageError):
    """A host tool needed to build the base image is not installed; names the package."""

    code = "invalid_argument"


class BackendError(OrchestratorError):
    """The container engine refused or failed a request."""


class BackendUnavailableError(BackendError):
    """The container engine cannot be reached, or lacks something the policy requires."""

    code = "backend_unavailable"


class ContainerNotFoundError(BackendError):
    """The engine has no such container or exec (or image), or the container no longer runs;
    callers turn it into ``session_not_found`` for the session whose container it was."""
