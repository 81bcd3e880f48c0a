"""What a sandbox's calls answer, as typed values read from a tool's structured result: the
cell's ``Execution`` (its rich ``Result`` objects and its ``CellFailure``), a command's
``CommandResult``, a sandbox's ``SandboxInfo``, a file's ``FileInfo``, a variable's
``Variable``. Each keeps the fields it came from in ``raw``, for what it does not name."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CellFailure",
    "CommandResult",
    "Execution",
    "FileInfo",
    "HistoryItem",
    "Interruption",
    "Result",
    "SandboxInfo",
    "SandboxMetrics",
    "Variable",
]

# The envelope every tool result shares; the typed values carry what the operation added.
_ENVELOPE = frozenset({"success", "operation"})


def payload(structured: dict[str, Any]) -> dict[str, Any]:
    """A structured result without its envelope."""
    return {k: v for k, v in structured.items() if k not in _ENVELOPE}


@dataclass(frozen=True)
class Result:
    """One rich result of a cell, a MIME bundle: the value of its final expression
    (``is_main_result``) or something it displayed. Binary formats are decoded to bytes."""

    raw: dict[str, Any]

    def _text(self, mime: str) -> str | None:
        value = self.raw.get(mime)
        return value if isinstance(value, str) else None

    def _bytes(self, mime: str) -> bytes | None:
        value = self._text(mime)
        return None if value is None else base64.b64decode(value)

    @property
    def text(self) -> str | None:
        return self._text("text/plain")

    @property
    def html(self) -> str | None:
        return self._text("text/html")

    @property
    def markdown(self) -> str | None:
        return self._text("text/markdown")

    @property
    def svg(self) -> str | None:
        return self._text("image/svg+xml")

    @property
    def latex(self) -> str | None:
        return self._text("text/latex")

    @property
    def png(self) -> bytes | None:
        return self._bytes("image/png")

    @property
    def jpeg(self) -> bytes | None:
        return self._bytes("image/jpeg")

    @property
    def json(self) -> Any:
        return self.raw.get("application/json")

    @property
    def is_main_result(self) -> bool:
        return self.raw.get("is_main_result") is True

    @property
    def truncated(self) -> bool:
        return self.raw.get("truncated") is True

    def formats(self) -> list[str]:
        """The MIME types this result carries."""
        return [k for k in self.raw if "/" in k]


@dataclass(frozen=True)
class CellFailure:
    """What ended a cell early: an exception of the user's code (``name`` is its class), or
    ``timeout``, ``import_blocked``, ``validation``, ``process_crashed``, ``output_limit``."""

    name: str
    value: str
    traceback: str | None


@dataclass(frozen=True)
class Execution:
    """One ``run_code``: all of its output, its rich results, its error if it raised."""

    stdout: str
    stderr: str
    results: list[Result]
    error: CellFailure | None
    execution_time_ms: float
    cpu_time_ms: float
    peak_memory_mb: float
    timed_out: bool
    state_reset: bool
    truncated: bool
    result_repr: str | None
    raw: dict[str, Any] = field(repr=False)

    @property
    def text(self) -> str | None:
        """The main result as text: its ``text/plain``, else the ``repr()`` of the value."""
        for result in self.results:
            if result.is_main_result and result.text is not None:
                return result.text
        return self.result_repr

    @classmethod
    def of(cls, structured: dict[str, Any]) -> Execution:
        error = None
        if not structured.get("success", False):
            error = CellFailure(
                name=str(structured.get("error_type") or "error"),
                value=str(structured.get("error_message") or ""),
                traceback=structured.get("traceback"),
            )
        return cls(
            stdout=structured.get("stdout", ""),
            stderr=structured.get("stderr", ""),
            results=[Result(bundle) for bundle in structured.get("results", [])],
            error=error,
            execution_time_ms=float(structured.get("execution_time_ms", 0.0)),
            cpu_time_ms=float(structured.get("cpu_time_ms", 0.0)),
            peak_memory_mb=float(structured.get("peak_memory_mb", 0.0)),
            timed_out=bool(structured.get("timed_out", False)),
            state_reset=bool(structured.get("state_reset", False)),
            truncated=bool(structured.get("truncated", False)),
            result_repr=structured.get("result_repr"),
            raw=payload(structured),
        )


@dataclass(frozen=True)
class CommandResult:
    """A command that ended (or ran out of time). ``stdout`` holds stderr too, interleaved as
    the command wrote them: the shell and terminals of a session keep one stream."""

    stdout: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    cwd: str | None = None


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    policy: str
    created_at: str
    idle_seconds: float
    raw: dict[str, Any] = field(repr=False)
    # The labels given at create (``metadata=``).
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, row: dict[str, Any]) -> SandboxInfo:
        return cls(
            sandbox_id=row["session_id"],
            policy=row.get("policy", ""),
            created_at=row.get("created_at", ""),
            idle_seconds=float(row.get("idle_seconds", 0.0)),
            raw=row,
            metadata=dict(row.get("metadata") or {}),
        )


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a session (``snapshot()``, ``list_snapshots``): what a session made from
    it gets (``keeps``: files, policy, metadata, env) and ``repl_state`` (``"fresh"``: a REPL's
    memory is never kept). ``env_names`` only: the values are not answered."""

    snapshot_id: str
    policy: str
    source_session: str
    created_at: str
    size_bytes: int
    metadata: dict[str, str]
    env_names: list[str]
    keeps: list[str]
    repl_state: str

    @classmethod
    def of(cls, row: dict[str, Any]) -> SnapshotInfo:
        return cls(
            snapshot_id=row["snapshot_id"],
            policy=row.get("policy", ""),
            source_session=row.get("source_session", ""),
            created_at=row.get("created_at", ""),
            size_bytes=int(row.get("size_bytes", 0)),
            metadata=dict(row.get("metadata") or {}),
            env_names=list(row.get("env_names") or []),
            keeps=list(row.get("keeps") or []),
            repl_state=str(row.get("repl_state", "fresh")),
        )


@dataclass(frozen=True)
class SandboxMetrics:
    """The session's container now (``metrics()``): CPU time since it started, CPU use since
    the previous ``metrics()`` in percent of one CPU (None the first time), memory in bytes."""

    cpu_seconds: float
    cpu_percent: float | None
    memory_bytes: int
    memory_limit_bytes: int
    pids: int
    sampled_at: str

    @classmethod
    def of(cls, answer: dict[str, Any]) -> SandboxMetrics:
        percent = answer.get("cpu_percent")
        return cls(
            cpu_seconds=float(answer.get("cpu_seconds", 0.0)),
            cpu_percent=None if percent is None else float(percent),
            memory_bytes=int(answer.get("memory_bytes", 0)),
            memory_limit_bytes=int(answer.get("memory_limit_bytes", 0)),
            pids=int(answer.get("pids", 0)),
            sampled_at=str(answer.get("sampled_at", "")),
        )


@dataclass(frozen=True)
class FileInfo:
    """One entry of a directory (``files.list``)."""

    name: str
    type: str
    size: int
    mode: str
    mtime: float
    link_target: str | None = None


@dataclass(frozen=True)
class Variable:
    """A variable of the session: ``variables()`` fills name and type, ``inspect`` the rest."""

    name: str
    type: str | None
    repr: str | None = None
    length: int | None = None
    doc: str | None = None
    signature: str | None = None
    shape: list[int] | str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class HistoryItem:
    index: int
    code: str
    success: bool
    summary: str
    timestamp: str
    # ``ok``, ``error`` or ``cancelled`` (stopped by its caller's cancel or by ``interrupt``).
    outcome: str = ""


@dataclass(frozen=True)
class Interruption:
    """What ``interrupt()`` did: whether a cell was running and is now stopped, which call ran
    it, how long it had run, and whether its interpreter had to be replaced (state lost)."""

    interrupted: bool
    running: str | None = None
    ran_for_s: float | None = None
    state_reset: bool = False

    @classmethod
    def of(cls, answer: dict[str, Any]) -> Interruption:
        return cls(
            interrupted=bool(answer.get("interrupted")),
            running=answer.get("running"),
            ran_for_s=answer.get("ran_for_s"),
            state_reset=bool(answer.get("state_reset")),
        )


@dataclass(frozen=True)
class CodeContext:
    """A REPL context of the session: its id (``default`` for the session's own REPL), its
    language and its working directory (None: the session's)."""

    id: str
    language: str
    cwd: str | None = None

    @classmethod
    def of(cls, answer: dict[str, Any]) -> CodeContext:
        return cls(id=answer["id"], language=answer["language"], cwd=answer.get("cwd"))
