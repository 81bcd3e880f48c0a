"""The error tree of sandhold: every error it raises on purpose is one of these. Each carries a
stable ``code``, the ``error_type`` every interface reports; messages are for people and may
change, codes may not.

    OrchestratorError                      internal
    ├── InvalidArgumentError               invalid_argument
    │   ├── SettingsFileError              invalid_argument
    │   │   ├── PolicyFileError            invalid_argument
    │   │   ├── TenantsFileError           invalid_argument
    │   │   ├── ConfigFileError            invalid_argument
    │   │   └── TemplateFileError          invalid_argument
    │   ├── UnknownPolicyError             invalid_argument
    │   ├── UnknownTemplateError           unknown_template
    │   ├── RegistryError                  invalid_argument
    │   ├── BodyTooLargeError              invalid_argument (HTTP 413)
    │   ├── UnsupportedEncodingError       invalid_argument (HTTP 415)
    │   └── PathNotFoundError              path_not_found
    ├── SessionNotFoundError               session_not_found
    │   └── SessionLostError               session_lost
    ├── PolicyViolationError               policy
    ├── QuotaExceededError                 quota_exceeded
    ├── BusyError                          busy
    ├── ExecutionError                     internal
    │   └── ProcessCrashedError            process_crashed
    ├── AuditLogError                      internal
    ├── StorageFullError                   storage_full
    ├── ImageError                         internal
    │   ├── ImageToolMissingError          invalid_argument
    │   └── TemplateNotBuiltError          template_not_built
    └── BackendError                       internal
        ├── BackendUnavailableError        backend_unavailable
        ├── ContainerNotFoundError         internal
        └── NotSupportedError              not_supported

``validation``, ``import_blocked``, ``timeout`` and ``output_limit`` are what a cell or a command
did: fields of its result, never raised. Errors raised by *user code* inside a sandbox are data
in a result, never one of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

__all__ = [
    "ERROR_TYPES",
    "AuditLogError",
    "BackendError",
    "BackendUnavailableError",
    "BodyTooLargeError",
    "BusyError",
    "ConfigFileError",
    "ContainerNotFoundError",
    "ExecutionError",
    "ImageError",
    "ImageToolMissingError",
    "InvalidArgumentError",
    "NotSupportedError",
    "OrchestratorError",
    "PathNotFoundError",
    "PolicyFileError",
    "PolicyViolationError",
    "ProcessCrashedError",
    "QuotaExceededError",
    "RegistryError",
    "SessionLostError",
    "SessionNotFoundError",
    "SettingsFileError",
    "StorageFullError",
    "TemplateFileError",
    "TemplateNotBuiltError",
    "TenantsFileError",
    "UnknownPolicyError",
    "UnknownTemplateError",
    "UnsupportedEncodingError",
]

ERROR_TYPES: Final = (
    "invalid_argument",
    "session_not_found",
    "session_lost",
    "validation",
    "import_blocked",
    "timeout",
    "process_crashed",
    "output_limit",
    "quota_exceeded",
    "policy",
    "busy",
    "backend_unavailable",
    "not_supported",
    "unknown_template",
    "template_not_built",
    "storage_full",
    "path_not_found",
    "internal",
)


class OrchestratorError(Exception):
    """Root of every error sandhold raises on purpose."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # The class's code; an error rebuilt from a server's answer keeps the type it answered.
        self.error_type: str = self.code

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, str]:
        """The ``error_type`` / ``error_message`` pair every interface shows."""
        return {"error_type": self.code, "error_message": str(self)}


class InvalidArgumentError(OrchestratorError):
    """An argument, file or setting given by the caller is malformed or out of bounds."""

    code = "invalid_argument"


class SettingsFileError(InvalidArgumentError):
    """A settings file cannot be read, parsed or validated; names the file, key and reason."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        super().__init__(f"{file}: {key}: {reason}")
        self.file = file
        self.key = key
        self.reason = reason


class PolicyFileError(SettingsFileError):
    """A policy file cannot be read, parsed or validated."""


class UnknownPolicyError(InvalidArgumentError):
    """No policy of that name was loaded (at start or at the last reload)."""


class TenantsFileError(SettingsFileError):
    """A tenants file or an API key file cannot be read or validated."""


class ConfigFileError(SettingsFileError):
    """A ``serve --config`` file cannot be read or validated."""


class TemplateFileError(SettingsFileError):
    """A template file (or its lock or Dockerfile) cannot be read, parsed or validated."""


class UnknownTemplateError(InvalidArgumentError):
    """No template of that name is shipped or in the template directories; when a policy file
    names it, the error names the file and the key."""

    code = "unknown_template"

    def __init__(
        self, name: str, known: Sequence[str], *, file: str | None = None, key: str | None = None
    ) -> None:
        where = f"{file}: {key}: " if file is not None and key is not None else ""
        super().__init__(f"{where}unknown template {name!r} (known: {', '.join(known)})")
        self.name = name
        self.file = file
        self.key = key


class RegistryError(InvalidArgumentError):
    """The registry file cannot be used: locked by another orchestrator, or not ours."""


class BodyTooLargeError(InvalidArgumentError):
    """An HTTP request body is larger than the server accepts (answered 413)."""


class UnsupportedEncodingError(InvalidArgumentError):
    """An HTTP request body in a ``Content-Encoding`` the server does not decode (answered 415)."""


class PathNotFoundError(InvalidArgumentError):
    """No file or directory at that path in the session (the session itself exists)."""

    code = "path_not_found"


class SessionNotFoundError(OrchestratorError):
    """No session (or terminal, or process) with this id is visible to the caller."""

    code = "session_not_found"


class SessionLostError(SessionNotFoundError):
    """The caller's session ended without being asked to: its container stopped or vanished
    (an engine restart, a kill from outside, a failed re-adoption); ``cause`` says which. Only
    its owner is told; anyone else gets ``session_not_found`` as for any unknown id."""

    code = "session_lost"

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message)
        self.cause = cause

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "cause": self.cause}


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


class ProcessCrashedError(ExecutionError):
    """The process serving the request died; ``cause`` says how (exit, signal, OOM)."""

    code = "process_crashed"

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class AuditLogError(OrchestratorError):
    """The audit log cannot be opened or written: in use, closed, unreadable or disk failing."""


class StorageFullError(OrchestratorError):
    """sandhold's own data directory (registry, audit log) refused a write: its disk is full or
    failing; names the file. Nothing of the call was kept; it may be made again once there is
    room."""

    code = "storage_full"


class ImageError(OrchestratorError):
    """Building or finding the sandbox image failed."""


class ImageToolMissingError(ImageError):
    """A host tool needed to build the base image is not installed; names the package."""

    code = "invalid_argument"


class TemplateNotBuiltError(ImageError):
    """A policy's template has no image, and this backend builds none (set its image in the
    configuration, or build it with ``sandhold image build --template NAME``)."""

    code = "template_not_built"


class BackendError(OrchestratorError):
    """The container engine refused or failed a request."""


class BackendUnavailableError(BackendError):
    """The container engine cannot be reached, or lacks something the policy requires."""

    code = "backend_unavailable"


class ContainerNotFoundError(BackendError):
    """The engine has no such container or exec (or image), or the container no longer runs;
    callers turn it into ``session_not_found`` for the session whose container it was."""


class NotSupportedError(BackendError):
    """The backend in use cannot do this at all (a Kubernetes backend cannot snapshot a
    session); the same call may work on another backend. Names the operation and the backend."""

    code = "not_supported"
