"""The audit log's verifier: one streaming pass over a log that names each problem and where.

``verify`` reads a log directory (or one segment file) line by line and checks every record's
hash, sequence number, link to the record before it and place in its segment; a partial last
line is a problem unless the next segment's first record acknowledges exactly those bytes. A
call's ``call_begin`` record with no ``call`` record of the same ``call_id`` after it is a call
the process stopped during (``kill -9``, a crash): a note names each, not a problem.

Invariants:
- Read-only, and memory bounded by one line plus ``MAX_PROBLEMS`` problems and the calls begun
  but not yet ended at any point: a log of any size verifies, and a wrecked one only counts the
  problems past that.
- A malformed line is one problem, not one per record after it: the chain is picked up again
  from the next readable record, whose link back across the bad line goes unchecked. A single
  segment file not starting the log is checked from its first record on, and a note says its
  link to the segment before it was not.
- A hash chain alone cannot show records cut off the end or a log rewritten from some point on:
  keep ``AuditLog.head`` elsewhere and give it to ``verify(expect_head=)`` for that.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.audit.records import (
    GENESIS_HASH,
    SEGMENT_NAME,
    TornTail,
    content_hash,
    decode_record,
    segment_files,
    segment_name,
)
from orchestrator.errors import AuditLogError, InvalidArgumentError

__all__ = ["MAX_PROBLEMS", "AuditProblem", "VerifyReport", "verify"]

# A wrecked log would give one problem per line; past this many they are only counted.
MAX_PROBLEMS: Final = 1000
# Calls begun with no recorded end are counted; this many are named in the note.
MAX_UNFINISHED_SHOWN: Final = 50


@dataclass(frozen=True)
class AuditProblem:
    """One thing wrong with a log, and where: segment file, line (1-based), sequence number."""

    segment: str
    line: int
    seq: int | None
    kind: str  # malformed, edited, sequence, chain, segment, torn_tail, head, missing
    detail: str

    def __str__(self) -> str:
        seq = "" if self.seq is None else f" (seq {self.seq})"
        return f"{self.segment} line {self.line}{seq}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found: ``ok`` when no problem; notes are facts that are not problems."""

    records: int
    segments: int
    last_seq: int | None
    last_hash: str
    problems: tuple[AuditProblem, ...]
    more_problems: int = 0
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems and not self.more_problems


def verify(path: str | os.PathLike[str], *, expect_head: str | None = None) -> VerifyReport:
    """Check a log directory (or one segment file) line by line, streaming: every record's hash,
    sequence number, link to the record before and place in its segment. ``expect_head``, the
    last hash kept elsewhere, also catches records cut off the end."""
    path = Path(path)
    if path.is_dir():
        files, whole = [p for _, p in segment_files(path)], True
    elif path.is_file():
        files, whole = [path], False
    else:
        raise InvalidArgumentError(f"{path}: no audit log directory or segment file here")
    checker = _Checker(whole_log=whole)
    for index, file in enumerate(files):
        try:
            checker.check_segment(file, last=index == len(files) - 1)
        except OSError as exc:
            raise AuditLogError(f"{file}: cannot read it: {exc}") from exc
    if not files:
        checker.problem(path.name, 0, None, "missing", "no audit segment in this directory")
    return checker.report(expect_head)


class _Checker:
    """The state of one streaming pass: what the next record must carry."""

    def __init__(self, *, whole_log: bool) -> None:
        self.whole_log = whole_log
        # None: unknown (a single file not starting the log, or after an unreadable line).
        self.expected_seq: int | None = 0 if whole_log else None
        self.expected_prev: str | None = GENESIS_HASH if whole_log else None
        self.previous_number = 0
        self.pending_torn: TornTail | None = None
        self.records = self.segments = self.more_problems = 0
        self.last_seq: int | None = None
        self.last_hash = GENESIS_HASH
        self.last_place = ("", 0)
        self.problems: list[AuditProblem] = []
        self.notes: list[str] = []
        # Calls begun (``call_begin``) whose end record has not come yet, by call id.
        self.begun: dict[str, str] = {}

    def problem(self, segment: str, line: int, seq: int | None, kind: str, detail: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(AuditProblem(segment, line, seq, kind, detail))
        else:
            self.more_problems += 1

    def check_segment(self, path: Path, *, last: bool) -> None:
        self.segments += 1
        match = SEGMENT_NAME.fullmatch(path.name)
        number = int(match[1]) if match else None
        if self.whole_log and number is not None and number != self.previous_number + 1:
            gap = f"{segment_name(self.previous_number + 1)} to {segment_name(number - 1)}"
            self.problem(path.name, 1, None, "missing", f"segments {gap} are missing before it")
        self.previous_number = number or self.previous_number
        offset = line = 0
        with path.open("rb") as file:
            for raw in file:
                line += 1
                if not raw.endswith(b"\n"):
                    digest = hashlib.sha256(raw).hexdigest()
                    self._torn(TornTail(path.name, line, offset, len(raw), digest), last=last)
                    break
                self._check_line(path.name, number, line, raw[:-1])
                offset += len(raw)
        if line == 0:
            self.problem(
                path.name,
                0,
                None,
                "segment",
                "empty: no segment record (a crash just after it was made?)",
            )

    def _torn(self, torn: TornTail, *, last: bool) -> None:
        if not last:
            self.pending_torn = torn
            return
        self.problem(
            torn.segment,
            torn.line,
            None,
            "torn_tail",
            f"partial last line ({torn.length} bytes at offset {torn.offset}): a write was cut "
            "short; the next open starts a new segment that records it",
        )

    def _check_line(self, name: str, number: int | None, line: int, raw: bytes) -> None:
        try:
            record = decode_record(raw)
        except ValueError as exc:
            self.problem(name, line, None, "malformed", str(exc))
            self.expected_seq = self.expected_prev = None  # the chain cannot be followed across
            return
        seq = record["seq"]
        if self.expected_seq is None and self.records == 0:
            self._anchor(name, record)
        self.records += 1
        if content_hash(record) != record["hash"]:
            self.problem(name, line, seq, "edited", "its hash does not match its content")
        if self.expected_seq is not None and seq != self.expected_seq:
            self.problem(name, line, seq, "sequence", self._sequence_detail(seq))
        if self.expected_prev is not None and record["prev"] != self.expected_prev:
            where, at = self.last_place
            before = f"{where} line {at}" if at else "the genesis value"
            detail = f"its prev is not the hash of {before}: a record was changed, removed or "
            self.problem(name, line, seq, "chain", detail + "inserted between them")
        self._check_place(name, number, line, record)
        self._follow_call(name, line, record)
        self.expected_seq, self.expected_prev = seq + 1, record["hash"]
        self.last_seq, self.last_hash, self.last_place = seq, record["hash"], (name, line)

    def _anchor(self, name: str, record: dict[str, Any]) -> None:
        """A single segment file: the chain starts at genesis only in the first segment."""
        if record.get("kind") == "segment" and record.get("segment") == 1:
            self.expected_seq, self.expected_prev = 0, GENESIS_HASH
        else:
            self.notes.append(
                f"{name} starts at seq {record['seq']}; its link to the segment before it is "
                "not checked (verify the whole directory for that)"
            )

    def _sequence_detail(self, seq: int) -> str:
        expected = self.expected_seq
        if seq == self.last_seq:
            return f"repeats seq {seq} of the record before it: a record was inserted"
        if expected is not None and seq > expected:
            return f"expected seq {expected}: {seq - expected} record(s) missing or moved before it"
        return f"expected seq {expected}: records out of order"

    def _check_place(
        self, name: str, number: int | None, line: int, record: Mapping[str, Any]
    ) -> None:
        seq, kind = record["seq"], record.get("kind")
        if line > 1:
            if kind == "segment":
                self.problem(name, line, seq, "segment", "a segment record inside a segment")
            return
        if kind != "segment":
            self.problem(name, line, seq, "segment", "a segment must open with a segment record")
        elif number is not None and record.get("segment") != number:
            detail = f"says segment {record.get('segment')}, but the file is segment {number}"
            self.problem(name, line, seq, "segment", detail)
        claimed = record.get("torn") if record.get("reason") == "torn_tail" else None
        torn, self.pending_torn = self.pending_torn, None
        if torn is not None and claimed == torn.to_json():
            self.notes.append(
                f"{torn.segment} line {torn.line}: a partial record of {torn.length} bytes left "
                f"by a crash, recorded by seq {seq} in {name}"
            )
        elif torn is not None:
            self._unacknowledged(torn)
        elif claimed is not None and self.whole_log:
            detail = f"records a partial line in {claimed.get('segment')} that is not there"
            self.problem(name, line, seq, "torn_tail", detail)

    def _unacknowledged(self, torn: TornTail) -> None:
        detail = f"partial line ({torn.length} bytes at offset {torn.offset}) not recorded by the "
        self.problem(torn.segment, torn.line, None, "torn_tail", detail + "next segment")

    def _follow_call(self, name: str, line: int, record: Mapping[str, Any]) -> None:
        call_id = record.get("call_id")
        if not isinstance(call_id, str):
            return
        if record.get("kind") == "call_begin":
            what = f"{record.get('tool')}.{record.get('operation')}"
            self.begun[call_id] = f"{call_id} ({what}, {name} line {line})"
        elif record.get("kind") == "call":
            self.begun.pop(call_id, None)

    def report(self, expect_head: str | None) -> VerifyReport:
        if self.pending_torn is not None:
            self._unacknowledged(self.pending_torn)
        if self.begun:
            shown = list(self.begun.values())[:MAX_UNFINISHED_SHOWN]
            self.notes.append(
                f"{len(self.begun)} call(s) begun with no recorded end (the process stopped "
                f"during them): {'; '.join(shown)}"
            )
        if expect_head is not None and expect_head != self.last_hash:
            where, at = self.last_place
            detail = f"the last hash is {self.last_hash}, expected {expect_head}: records were "
            self.problem(where, at, self.last_seq, "head", detail + "cut off the end or added")
        return VerifyReport(
            records=self.records,
            segments=self.segments,
            last_seq=self.last_seq,
            last_hash=self.last_hash,
            problems=tuple(self.problems),
            more_problems=self.more_problems,
            notes=tuple(self.notes),
        )
