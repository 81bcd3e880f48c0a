"""Per-session code history, and a context of it for another agent: the newest cells whole with
their output, older ones one line each, fitted to a token budget by dropping the oldest first.

Every cell that ran is kept, with its outcome: ``ok``, ``error`` (the code failed or timed out),
or ``cancelled`` (stopped before its end by its caller's cancel or by ``interrupt``: it may well
have changed the session's state, so it belongs in the history as much as any other)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["CANCELLED", "CodeHistory", "HistoryEntry"]

CANCELLED = "cancelled"

# A rough but stable estimate; real tokenizers average 3.5-4.5 characters per token for code.
CHARS_PER_TOKEN = 4
RECENT_IN_FULL = 3
OUTPUT_IN_CONTEXT_CHARS = 2000
SUMMARY_CODE_CHARS = 80
SUMMARY_OUTPUT_CHARS = 60


@dataclass(frozen=True)
class HistoryEntry:
    index: int
    code: str
    timestamp: datetime
    success: bool
    output: str
    cancelled: bool = False

    @property
    def outcome(self) -> str:
        """``ok``, ``error`` or ``cancelled``."""
        if self.cancelled:
            return CANCELLED
        return "ok" if self.success else "error"

    @property
    def summary(self) -> str:
        return _one_line(self.output, SUMMARY_OUTPUT_CHARS) or self.outcome

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "code": self.code,
            "timestamp": self.timestamp.isoformat(),
            "success": self.success,
            "outcome": self.outcome,
            "summary": self.summary,
        }

    def in_full(self) -> str:
        status = self.outcome
        text = f"[{self.index}] ({status})\n```python\n{self.code}\n```"
        if self.output:
            text += f"\nOutput:\n{self.output[:OUTPUT_IN_CONTEXT_CHARS]}"
        return text

    def in_one_line(self) -> str:
        arrow = f" -> {self.summary}"
        return f"[{self.index}] {_one_line(self.code, SUMMARY_CODE_CHARS)}{arrow}"


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class CodeHistory:
    def __init__(self, max_entries: int) -> None:
        self._entries: deque[HistoryEntry] = deque(maxlen=max_entries)
        self._count = 0

    def record(
        self, code: str, *, success: bool, output: str, cancelled: bool = False
    ) -> HistoryEntry:
        self._count += 1
        entry = HistoryEntry(self._count, code, datetime.now(UTC), success, output, cancelled)
        self._entries.append(entry)
        return entry

    def restore(self, entries: list[HistoryEntry]) -> None:
        """Take back the entries a registry kept (after a restart of the orchestrator)."""
        self._entries.extend(entries)
        if entries:
            self._count = max(self._count, entries[-1].index)

    @property
    def entries(self) -> list[HistoryEntry]:
        return list(self._entries)

    @property
    def count(self) -> int:
        return self._count

    def clear(self) -> None:
        self._entries.clear()

    def context(self, max_tokens: int) -> str:
        """The history as text of at most ``max_tokens`` (estimated); oldest detail goes first."""
        budget = max_tokens * CHARS_PER_TOKEN
        entries = self.entries
        older = [e.in_one_line() for e in entries[:-RECENT_IN_FULL]]
        recent = [e.in_full() for e in entries[-RECENT_IN_FULL:]]
        while older and _size(older, recent) > budget:
            older.pop(0)
        while len(recent) > 1 and _size(older, recent) > budget:
            recent.pop(0)
        text = "\n\n".join([*older, *recent])
        marker = "\n…(truncated)"
        if len(text) > budget:
            text = text[: budget - len(marker)] + marker if budget > len(marker) else ""
        return text


def _size(older: list[str], recent: list[str]) -> int:
    parts = [*older, *recent]
    return sum(len(p) for p in parts) + 2 * max(len(parts) - 1, 0)
