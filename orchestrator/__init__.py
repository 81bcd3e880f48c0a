"""sandhold: a container-isolated sandbox orchestrator.

    async with Orchestrator() as sandhold:
        result = await sandhold.call("python_repl", {"operation": "execute", "code": "1 + 1"})

``SyncOrchestrator`` offers the same without an event loop. ``AsyncSandbox`` (and its blocking
twin ``Sandbox``) is one session as a typed handle, over an orchestrator here or a server:

    async with AsyncSandbox.create(orchestrator=sandhold) as sandbox:
        execution = await sandbox.run_code("1 + 1")
 The four tools and their operations
are in ``TOOLS``; every error carries a stable ``code`` (its ``error_type``).
"""

from typing import TYPE_CHECKING

from orchestrator._lazy import lazy_exports

# Each public name and the module it comes from. Imported on first use (PEP 562), so a command
# that needs little (``sandhold mcp`` answering ``initialize``) does not pay for the whole package.
_EXPORTS = {
    "Variable": "orchestrator.sandbox",
    "SandboxInfo": "orchestrator.sandbox",
    "SandboxMetrics": "orchestrator.sandbox",
    "SnapshotInfo": "orchestrator.sandbox",
    "Sandbox": "orchestrator.sandbox",
    "Result": "orchestrator.sandbox",
    "HistoryItem": "orchestrator.sandbox",
    "Interruption": "orchestrator.sandbox",
    "ProcessHandle": "orchestrator.sandbox",
    "Execution": "orchestrator.sandbox",
    "FileInfo": "orchestrator.sandbox",
    "CommandResult": "orchestrator.sandbox",
    "CommandHandle": "orchestrator.sandbox",
    "CellFailure": "orchestrator.sandbox",
    "AsyncSandbox": "orchestrator.sandbox",
    "TOOLS": "orchestrator.tools",
    "AuditLogError": "orchestrator.errors",
    "BackendError": "orchestrator.errors",
    "BackendUnavailableError": "orchestrator.errors",
    "BusyError": "orchestrator.errors",
    "ExecuteResult": "orchestrator._api",
    "ExecutionError": "orchestrator.errors",
    "ImageBuildResult": "orchestrator.images",
    "ImageError": "orchestrator.errors",
    "ImageToolMissingError": "orchestrator.errors",
    "InvalidArgumentError": "orchestrator.errors",
    "NotSupportedError": "orchestrator.errors",
    "Orchestrator": "orchestrator._api",
    "OrchestratorConfig": "orchestrator._api",
    "OrchestratorError": "orchestrator.errors",
    "Policy": "orchestrator.policy.model",
    "PathNotFoundError": "orchestrator.errors",
    "PolicyFileError": "orchestrator.errors",
    "PolicyViolationError": "orchestrator.errors",
    "ProcessCrashedError": "orchestrator.errors",
    "QuotaExceededError": "orchestrator.errors",
    "RegistryError": "orchestrator.errors",
    "SessionLostError": "orchestrator.errors",
    "SessionNotFoundError": "orchestrator.errors",
    "SettingsFileError": "orchestrator.errors",
    "StorageFullError": "orchestrator.errors",
    "SyncOrchestrator": "orchestrator.sync",
    "TemplateFileError": "orchestrator.errors",
    "TemplateNotBuiltError": "orchestrator.errors",
    "TenantsFileError": "orchestrator.errors",
    "Tool": "orchestrator.tools",
    "ToolResult": "orchestrator.tools",
    "UnknownPolicyError": "orchestrator.errors",
    "UnknownTemplateError": "orchestrator.errors",
    "ensure_worker_image": "orchestrator.images",
    "load_policy": "orchestrator.policy.model",
    "shipped_policy_names": "orchestrator.policy.model",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from orchestrator._api import ExecuteResult, Orchestrator, OrchestratorConfig
    from orchestrator.errors import (
        AuditLogError,
        BackendError,
        BackendUnavailableError,
        BusyError,
        ExecutionError,
        ImageError,
        ImageToolMissingError,
        InvalidArgumentError,
        NotSupportedError,
        OrchestratorError,
        PathNotFoundError,
        PolicyFileError,
        PolicyViolationError,
        ProcessCrashedError,
        QuotaExceededError,
        RegistryError,
        SessionLostError,
        SessionNotFoundError,
        SettingsFileError,
        StorageFullError,
        TemplateFileError,
        TemplateNotBuiltError,
        TenantsFileError,
        UnknownPolicyError,
        UnknownTemplateError,
    )
    from orchestrator.images import ImageBuildResult, ensure_worker_image
    from orchestrator.policy.model import Policy, load_policy, shipped_policy_names
    from orchestrator.sandbox import (
        AsyncSandbox,
        CellFailure,
        CommandHandle,
        CommandResult,
        Execution,
        FileInfo,
        HistoryItem,
        Interruption,
        ProcessHandle,
        Result,
        Sandbox,
        SandboxInfo,
        SandboxMetrics,
        SnapshotInfo,
        Variable,
    )
    from orchestrator.sync import SyncOrchestrator
    from orchestrator.tools import TOOLS, Tool, ToolResult

__all__ = [
    "TOOLS",
    "AsyncSandbox",
    "AuditLogError",
    "BackendError",
    "BackendUnavailableError",
    "BusyError",
    "CellFailure",
    "CommandHandle",
    "CommandResult",
    "ExecuteResult",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "HistoryItem",
    "ImageBuildResult",
    "ImageError",
    "ImageToolMissingError",
    "Interruption",
    "InvalidArgumentError",
    "NotSupportedError",
    "Orchestrator",
    "OrchestratorConfig",
    "OrchestratorError",
    "PathNotFoundError",
    "Policy",
    "PolicyFileError",
    "PolicyViolationError",
    "ProcessCrashedError",
    "ProcessHandle",
    "QuotaExceededError",
    "RegistryError",
    "Result",
    "Sandbox",
    "SandboxInfo",
    "SandboxMetrics",
    "SessionLostError",
    "SessionNotFoundError",
    "SettingsFileError",
    "SnapshotInfo",
    "StorageFullError",
    "SyncOrchestrator",
    "TemplateFileError",
    "TemplateNotBuiltError",
    "TenantsFileError",
    "Tool",
    "ToolResult",
    "UnknownPolicyError",
    "UnknownTemplateError",
    "Variable",
    "ensure_worker_image",
    "load_policy",
    "shipped_policy_names",
]
