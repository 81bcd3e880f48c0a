"""sandhold: a container-isolated sandbox orchestrator.

    async with Orchestrator() as sandhold:
        result = await sandhold.call("python_repl", {"operation": "execute", "code": "1 + 1"})

``SyncOrchestrator`` offers the same without an event loop. The four tools and their operations
are in ``TOOLS``; every error carries a stable ``code`` (its ``error_type``).
"""

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module it comes from. Imported on first use (PEP 562), so a command
# that needs little (``sandhold mcp`` answering ``initialize``) does not pay for the whole package.
_EXPORTS = {
    "TOOLS": "orchestrator.tools",
    "BackendUnavailableError": "orchestrator.errors",
    "BusyError": "orchestrator.errors",
    "ExecuteResult": "orchestrator._api",
    "ExecutionError": "orchestrator.errors",
    "ImageBuildResult": "orchestrator.images",
    "InvalidArgumentError": "orchestrator.errors",
    "Orchestrator": "orchestrator._api",
    "OrchestratorConfig": "orchestrator._api",
    "OrchestratorError": "orchestrator.errors",
    "Policy": "orchestrator.policy.model",
    "PolicyFileError": "orchestrator.errors",
    "PolicyViolationError": "orchestrator.errors",
    "QuotaExceededError": "orchestrator.errors",
    "SessionNotFoundError": "orchestrator.errors",
    "SyncOrchestrator": "orchestrator.sync",
    "Tool": "orchestrator.tools",
    "ToolResult": "orchestrator.tools",
    "ensure_worker_image": "orchestrator.images",
    "load_policy": "orchestrator.policy.model",
    "shipped_policy_names": "orchestrator.policy.model",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from orchestrator._api import ExecuteResult, Orchestrator, OrchestratorConfig
    from orchestrator.errors import (
        BackendUnavailableError,
        BusyError,
        ExecutionError,
        InvalidArgumentError,
        OrchestratorError,
        PolicyFileError,
        PolicyViolationError,
        QuotaExceededError,
        SessionNotFoundError,
    )
    from orchestrator.images import ImageBuildResult, ensure_worker_image
    from orchestrator.policy.model import Policy, load_policy, shipped_policy_names
    from orchestrator.sync import SyncOrchestrator
    from orchestrator.tools import TOOLS, Tool, ToolResult

__all__ = [
    "TOOLS",
    "BackendUnavailableError",
    "BusyError",
    "ExecuteResult",
    "ExecutionError",
    "ImageBuildResult",
    "InvalidArgumentError",
    "Orchestrator",
    "OrchestratorConfig",
    "OrchestratorError",
    "Policy",
    "PolicyFileError",
    "PolicyViolationError",
    "QuotaExceededError",
    "SessionNotFoundError",
    "SyncOrchestrator",
    "Tool",
    "ToolResult",
    "ensure_worker_image",
    "load_policy",
    "shipped_policy_names",
]
