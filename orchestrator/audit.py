"""The audit log: append-only JSON lines, each record carrying the hash of the one before it.

A log is a directory of numbered segments, ``audit-000001.jsonl``, ``audit-000002.jsonl``, ...
Each segment opens with a ``segment`` record; each tool call adds a ``call`` record. A record's
``hash`` is the sha256 of all its other fields (``prev`` among them) as canonical JSON (sorted
keys, no spaces, ASCII); ``prev`` is the ``hash`` of the record before it, across segments, and
``GENESIS_HASH`` for the first; ``seq`` counts records from 0 without a gap. Arguments are kept
as the sha256 of their canonical JSON, in clear only with ``AuditConfig.record_arguments``.

Invariants:
- One writer per directory: a ``flock`` on ``.lock`` keeps a second process out, and an anyio
  lock serializes the records of this one, so file order is ``seq`` order.
- A record is one ``write`` of one complete line to a descriptor opened with ``O_APPEND``. File
  I/O runs in a worker thread, and the writer's state changes only there, under the lock, after
  the write succeeded. Recording is shielded from cancellation: a cancelled call is audited too.
- A partial last line (a crash mid-write) is neither repaired nor appended to: the next open
  starts a new segment whose first record names the torn bytes (segment, line, offset, length,
  sha256), so ``verify`` tells an acknowledged crash from tampering.
- A hash chain alone cannot show records cut off the end or a log rewritten from some point on:
  keep ``AuditLog.head`` elsewhere and give it to ``verify(expect_head=)`` for that.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Final

import anyio

from orchestrator.errors import InvalidArgumentError, OrchestratorError

log = logging.getLogger(__name__)

GENESIS_HASH: Final = "0" * 64
FORMAT_VERSION: Final = 1
SEGMENT_NAME: Final = re.compile(r"audit-(\d{6,})\.jsonl")
LOCK_FILE: Final = ".lock"
# 64 MiB: a segment verifies in about a second, and the scan after a torn write stays cheap.
DEFAULT_MAX_SEGMENT_BYTES: Final = 64 * 1024 * 1024
# Reading a segment backwards for its last line; a call record is a few hundred bytes.
TAIL_CHUNK: Final = 64 * 1024
# A wrecked log would give one problem per line; past this many they are only counted.
MAX_PROBLEMS: Final = 1000


class AuditLogError(OrchestratorError):
    """The audit log cannot be opened or written: in use, closed, unreadable or disk failing."""


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Settings of an audit log."""

    # Store each call's arguments in clear beside their hash: code, file contents, secrets.
    record_arguments: bool = False
    # 1: every record is on disk when ``record`` returns; N: every N records and at close (a
    # crash of the host, not of sbx, may lose up to N-1); 0: whenever the OS writes it back.
    fsync_every: int = 1
    max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES


@dataclass(frozen=True)
class TornTail:
    """A partial last line of a segment: the bytes a crash left after its last complete line."""

    segment: str
    line: int
    offset: int
    length: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "line": self.line,
            "offset": self.offset,
            "length": self.length,
            "sha256": self.sha256,
        }


def arguments_digest(arguments: Any) -> str:
    """The sha256 of ``arguments`` as canonical JSON: equal arguments, equal digests."""
    return hashlib.sha256(_canonical_arguments(arguments).encode()).hexdigest()


def segment_name(number: int) -> str:
    return f"audit-{number:06d}.jsonl"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def _canonical_arguments(arguments: Any) -> str:
    try:
        return _canonical(arguments)
    except (TypeError, ValueError):  # keys of mixed types, or a circular structure
        return json.dumps(repr(arguments))


def _digest(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical(fields).encode()).hexdigest()


def _encode(fields: dict[str, Any]) -> tuple[bytes, str]:
    """One line (fields in their given order, ``hash`` last) and its hash."""
    digest = _digest(fields)
    text = json.dumps({**fields, "hash": digest}, separators=(",", ":"), ensure_ascii=True)
    return (text + "\n").encode(), digest


def _decode(raw: bytes) -> dict[str, Any]:
    """The record on one line (without its newline), or ValueError saying what is wrong."""
    text = raw.decode("ascii")
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if json.dumps(record, separators=(",", ":"), ensure_ascii=True) != text:
        raise ValueError("not in canonical form (the line was rewritten)")
    seq, prev, digest = record.get("seq"), record.get("prev"), record.get("hash")
    if type(seq) is not int or not isinstance(prev, str) or not isinstance(digest, str):
        raise ValueError("seq, prev or hash is missing or of the wrong type")
    if next(reversed(record)) != "hash":
        raise ValueError("hash is not the last field")
    return record


def _content_hash(record: Mapping[str, Any]) -> str:
    return _digest({key: value for key, value in record.items() if key != "hash"})


def _segment_files(directory: Path) -> list[tuple[int, Path]]:
    found = [(SEGMENT_NAME.fullmatch(p.name), p) for p in directory.iterdir() if p.is_file()]
    return sorted((int(match[1]), path) for match, path in found if match)


def _last_newlines(file: BinaryIO, size: int, count: int) -> list[int]:
    """Offsets of the last ``count`` newlines, last first, reading backwards from ``size``."""
    found: list[int] = []
    position = size
    while position > 0 and len(found) < count:
        start = max(0, position - TAIL_CHUNK)
        file.seek(start)
        chunk = file.read(position - start)
        index = len(chunk)
        while len(found) < count and (index := chunk.rfind(b"\n", 0, index)) >= 0:
            found.append(start + index)
        position = start
    return found


def _read_tail(path: Path) -> tuple[bytes | None, TornTail | None]:
    """The last complete line of a segment (without newline) and the partial line after it."""
    with path.open("rb") as file:
        size = file.seek(0, os.SEEK_END)
        newlines = _last_newlines(file, size, 2)
        end = newlines[0] + 1 if newlines else 0
        torn = _torn_tail(path, file, end) if end < size else None
        if not newlines:
            return None, torn
        start = newlines[1] + 1 if len(newlines) > 1 else 0
        file.seek(start)
        return file.read(end - 1 - start), torn


def _torn_tail(path: Path, file: BinaryIO, offset: int) -> TornTail:
    # Reads the whole segment (bounded by max_segment_bytes), only after a crash.
    file.seek(0)
    lines, position, digest = 0, 0, hashlib.sha256()
    while chunk := file.read(1 << 20):
        head = chunk[: max(0, offset - position)]
        lines += head.count(b"\n")
        digest.update(chunk[len(head) :])
        position += len(chunk)
    return TornTail(path.name, lines + 1, offset, position - offset, digest.hexdigest())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class _Writer:
    """The blocking half: the open segment and the chain's head. Runs in worker threads, one
    call at a time (the ``AuditLog`` lock)."""

    directory: Path
    config: AuditConfig
    number: int = 0
    fd: int = -1
    size: int = 0
    has_calls: bool = False
    # (seq, hash) of the last record, one attribute so a reader on the event loop sees a pair.
    tip: tuple[int, str] = (-1, GENESIS_HASH)
    unsynced: int = 0
    failed: OSError | None = field(default=None, repr=False)

    def resume(self) -> TornTail | None:
        """Continue the chain where the directory's last record left it."""
        segments = _segment_files(self.directory)
        if not segments:
            self._start_segment(1, {"reason": "new"})
            return None
        number, path = segments[-1]
        last, torn = _read_tail(path)
        source = path
        for _, earlier in reversed(segments[:-1]):  # only after a crash left no complete line
            if last is not None:
                break
            (last, _), source = _read_tail(earlier), earlier
        if last is not None:
            self._restore(last, source)
        if torn is not None:
            self._start_segment(number + 1, {"reason": "torn_tail", "torn": torn.to_json()})
        elif last is None or source != path:  # created, then a crash before its first record
            self._start_segment(number, {"reason": "new" if number == 1 else "rotate"}, reuse=True)
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            self.number, self.size = number, os.fstat(self.fd).st_size
        return torn

    def _restore(self, raw: bytes, path: Path) -> None:
        try:
            record = _decode(raw)
            if _content_hash(record) != record["hash"]:
                raise ValueError("its hash does not match its content")
        except ValueError as exc:
            raise AuditLogError(
                f"{path}: the last record is not valid ({exc})",
                hint=f"run `sbx audit verify {self.directory}`",
            ) from None
        self.tip = (record["seq"], record["hash"])
        self.has_calls = record.get("kind") != "segment"

    def append_call(self, *, arguments: Any, **call: Any) -> None:
        if self.failed is not None:
            raise AuditLogError("the audit log stopped after a failed write; reopen it")
        try:
            self._append_call(arguments, call)
        except OSError as exc:
            self.failed = exc
            raise AuditLogError(f"cannot write the audit log: {exc}") from exc

    def _append_call(self, arguments: Any, call: dict[str, Any]) -> None:
        canonical = _canonical_arguments(arguments)
        fields = {"kind": "call", **call}
        fields["args_sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
        if self.config.record_arguments:
            fields["arguments"] = json.loads(canonical)
        line = self._encode(fields)
        if self.has_calls and self.size + len(line[0]) > self.config.max_segment_bytes:
            self._start_segment(self.number + 1, {"reason": "rotate"})
            line = self._encode(fields)
        self._write(*line)

    def _encode(self, fields: dict[str, Any]) -> tuple[bytes, str]:
        base = {"v": FORMAT_VERSION, "seq": self.tip[0] + 1, "time": _now()}
        return _encode({**base, **fields, "prev": self.tip[1]})

    def _start_segment(self, number: int, header: dict[str, Any], *, reuse: bool = False) -> None:
        self.close()
        path = self.directory / segment_name(number)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | (0 if reuse else os.O_EXCL)
        self.fd = os.open(path, flags, 0o600)
        os.fchmod(self.fd, 0o600)
        _fsync_directory(self.directory)
        self.number, self.size = number, 0
        self._write(*self._encode({"kind": "segment", "segment": number, **header}))
        self.has_calls = False

    def _write(self, line: bytes, digest: str) -> None:
        written = os.write(self.fd, line)
        while written < len(line):  # short writes: regular files only do this on ENOSPC
            written += os.write(self.fd, line[written:])
        self.unsynced += 1
        if self.config.fsync_every and self.unsynced >= self.config.fsync_every:
            self._sync()
        self.tip, self.size, self.has_calls = (self.tip[0] + 1, digest), self.size + len(line), True

    def _sync(self) -> None:
        os.fdatasync(self.fd)
        self.unsynced = 0

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            if self.unsynced and self.failed is None:
                self._sync()
        finally:
            os.close(self.fd)
            self.fd = -1


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_directory(directory: Path) -> int:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AuditLogError(f"{directory}: the audit log is open in another process") from None
    return fd


class AuditLog:
    """An open audit log; one per directory and process. ``record`` after each tool call."""

    def __init__(self, writer: _Writer, lock_fd: int, torn_tail: TornTail | None) -> None:
        self._writer = writer
        self._lock_fd = lock_fd
        self._lock = anyio.Lock()
        self._closed = False
        #: What a crash left at the end of the log when it was opened (recorded, never repaired).
        self.torn_tail = torn_tail

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], config: AuditConfig | None = None
    ) -> AuditLog:
        """Open (or create) the log in directory ``path`` and continue its chain."""
        return await anyio.to_thread.run_sync(cls._open, Path(path), config or AuditConfig())

    @classmethod
    def _open(cls, directory: Path, config: AuditConfig) -> AuditLog:
        try:
            lock_fd = _lock_directory(directory)
        except OSError as exc:
            raise AuditLogError(f"{directory}: cannot open the audit log: {exc}") from exc
        writer = _Writer(directory, config)
        try:
            torn = writer.resume()
        except BaseException as exc:
            writer.close()
            os.close(lock_fd)
            if isinstance(exc, OSError):
                raise AuditLogError(f"{directory}: cannot open the audit log: {exc}") from exc
            raise
        if torn is not None:
            log.warning(
                "audit log: %s line %d ends in a partial record (%d bytes at offset %d, left by "
                "a crash); continuing in %s, whose first record names it",
                torn.segment, torn.line, torn.length, torn.offset, segment_name(writer.number),
            )  # fmt: skip
        return cls(writer, lock_fd, torn)

    @property
    def directory(self) -> Path:
        return self._writer.directory

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last record: keep it elsewhere to detect a cut-off end."""
        return self._writer.tip

    async def record(
        self,
        *,
        tenant: str,
        task: str | None,
        tool: str,
        operation: str | None,
        session_id: str | None,
        arguments: Any,
        success: bool,
        error_type: str | None,
        duration_ms: float,
    ) -> None:
        """Append one call record; raises ``AuditLogError`` if it cannot be written."""
        append = partial(
            self._writer.append_call,
            tenant=tenant,
            task=task,
            tool=tool,
            operation=operation,
            session_id=session_id,
            success=success,
            error_type=error_type,
            duration_ms=round(duration_ms, 3),
            arguments=arguments,
        )
        with anyio.CancelScope(shield=True):
            async with self._lock:
                if self._closed:
                    raise AuditLogError("the audit log is closed")
                await anyio.to_thread.run_sync(append)

    async def aclose(self) -> None:
        """Flush and close; idempotent."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                if self._closed:
                    return
                self._closed = True
                try:
                    await anyio.to_thread.run_sync(self._writer.close)
                finally:
                    os.close(self._lock_fd)

    async def __aenter__(self) -> AuditLog:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def open_audit_log(
    path: str | os.PathLike[str], config: AuditConfig | None = None
) -> AsyncIterator[AuditLog]:
    """``AuditLog.open`` as an async context manager that closes the log on exit."""
    async with await AuditLog.open(path, config) as audit:
        yield audit


# -- verification -----------------------------------------------------------------------------


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
        files, whole = [p for _, p in _segment_files(path)], True
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
            record = _decode(raw)
        except ValueError as exc:
            self.problem(name, line, None, "malformed", str(exc))
            self.expected_seq = self.expected_prev = None  # the chain cannot be followed across
            return
        seq = record["seq"]
        if self.expected_seq is None and self.records == 0:
            self._anchor(name, record)
        self.records += 1
        if _content_hash(record) != record["hash"]:
            self.problem(name, line, seq, "edited", "its hash does not match its content")
        if self.expected_seq is not None and seq != self.expected_seq:
            self.problem(name, line, seq, "sequence", self._sequence_detail(seq))
        if self.expected_prev is not None and record["prev"] != self.expected_prev:
            where, at = self.last_place
            before = f"{where} line {at}" if at else "the genesis value"
            detail = f"its prev is not the hash of {before}: a record was changed, removed or "
            self.problem(name, line, seq, "chain", detail + "inserted between them")
        self._check_place(name, number, line, record)
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

    def report(self, expect_head: str | None) -> VerifyReport:
        if self.pending_torn is not None:
            self._unacknowledged(self.pending_torn)
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
