"""The typed sandbox API: ``AsyncSandbox`` and its blocking twin ``Sandbox``, one session each,
over an ``Orchestrator`` in this process or a ``sandhold serve`` elsewhere; the values their
calls answer. It sits beside the interfaces: above the API and the tool layer, whose calls it
makes (``Orchestrator.call`` in-process, the REST API remotely), and below nothing."""

from orchestrator.sandbox._commands import (
    AsyncCommands,
    AsyncProcesses,
    AsyncTerminals,
    CommandHandle,
    ProcessHandle,
)
from orchestrator.sandbox._files import AsyncFiles
from orchestrator.sandbox._results import (
    CellFailure,
    CodeContext,
    CommandResult,
    Execution,
    FileInfo,
    HistoryItem,
    Interruption,
    Result,
    SandboxInfo,
    SandboxMetrics,
    SnapshotInfo,
    Variable,
)
from orchestrator.sandbox._sandbox import AsyncSandbox
from orchestrator.sandbox._sync import Sandbox

__all__ = [
    "AsyncCommands",
    "AsyncFiles",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncTerminals",
    "CellFailure",
    "CodeContext",
    "CommandHandle",
    "CommandResult",
    "Execution",
    "FileInfo",
    "HistoryItem",
    "Interruption",
    "ProcessHandle",
    "Result",
    "Sandbox",
    "SandboxInfo",
    "SandboxMetrics",
    "SnapshotInfo",
    "Variable",
]
