"""The wire models of the terminal operations: what ``SessionTerminals`` returns."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["TerminalResult", "TerminalState", "TerminalStatus", "WaitReason"]

TerminalState = Literal["running", "exited"]
WaitReason = Literal["output", "exited", "timeout"]


class TerminalResult(BaseModel):
    """Output since the caller's cursor (``start``, ``read``, ``wait``) and where to go on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    terminal_id: str
    state: TerminalState
    exit_code: int | None
    use_pty: bool
    output: str
    next_seq: int
    next_offset: int
    gap: bool = False
    dropped_bytes: int | None = None
    dropped_chunks: int | None = None
    has_more: bool = False
    truncated: bool = False
    omitted_chars: int = 0
    wait_reason: WaitReason | None = None


class TerminalStatus(BaseModel):
    """What ``write``, ``interrupt``, ``kill`` and ``resize`` did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    terminal_id: str
    state: TerminalState
    exit_code: int | None
    use_pty: bool
    stdin_closed: bool
    written_bytes: int = 0
    signal: str | None = None
    signal_sent: bool = False
    escalated: bool = False
