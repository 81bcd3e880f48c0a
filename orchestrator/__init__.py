"""sbx: a container-isolated sandbox orchestrator.

    async with Orchestrator() as sbx:
        result = await sbx.call("python_repl", {"operation": "execute", "code": "1 + 1"})

``SyncOrchestrator`` offers the same without an event loop. The four tools and their operations
are in ``TOOLS``; every error carries a stable ``code`` (its ``error_type``).
"""

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
from orchestrator.orchestrator import ExecuteResult, Orchestrator, OrchestratorConfig
from orchestrator.policy import Policy, load_policy, shipped_policy_names
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
