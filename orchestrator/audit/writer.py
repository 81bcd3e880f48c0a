"""The blocking half of the audit log: the open segment, the chain's head, and their settings.

``SegmentWriter`` continues a log directory's chain (``resume``), appends call records, starts
segments (on rotation and after a crash) and syncs them. ``orchestrator.audit.AuditLog`` runs
it in worker threads; nothing here is async.

Invariants:
- One call at a time: the caller serializes every method (``AuditLog`` holds a lock around
  each), and holds the directory's ``flock`` while the writer is open.
- A record is one ``write`` of one complete line to a descriptor opened with ``O_APPEND``; the
  writer's state (``tip``, ``size``) changes only after the write succeeded. After a failed
  write the writer refuses to append again: the log must be reopened.
- A partial last line (a crash mid-write) is neither repaired nor appended to: ``resume``
  starts a new segment whose first record names the torn bytes (segment, line, offset, length,
  sha256), so ``verify`` tells an acknowledged crash from tampering.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Final

from orchestrator.audit.records import (
    FORMAT_VERSION,
    GENESIS_HASH,
    TornTail,
    canonical_arguments,
    content_hash,
    decode_record,
    encode_record,
    redacted_arguments,
    segment_files,
    segment_name,
)
from orchestrator.errors import AuditLogError

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_SEGMENT_BYTES", "TAIL_CHUNK", "AuditConfig", "SegmentWriter"]

# 64 MiB: a segment verifies in about a second, and the scan after a torn write stays cheap.
DEFAULT_MAX_SEGMENT_BYTES: Final = 64 * 1024 * 1024
# Reading a segment backwards for its last line; a call record is a few hundred bytes.
TAIL_CHUNK: Final = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Settings of an audit log."""

    # Store each call's arguments in clear beside their hash: code, file contents, secrets.
    record_arguments: bool = False
    # 1: every record is on disk when ``record`` returns; N: every N records and at close (a
    # crash of the host, not of sandhold, may lose up to N-1); 0: whenever the OS writes it back.
    fsync_every: int = 1
    max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES


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
class SegmentWriter:
    """The open segment and the chain's head. Runs in worker threads, one call at a time (the
    ``AuditLog`` lock)."""

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
        segments = segment_files(self.directory)
        if not segments:
            self._start_segment(1, {"reason": "new"})
            return None
        number, path = segments[-1]
        last, torn = _read_tail(path)
        source = path
        for _, earlier in reversed(segments[:-1]):  # only after a crash left no complete line
            if last is not None:
                break
            (last, earlier_torn), source = _read_tail(earlier), earlier
            torn = torn or earlier_torn
        if last is not None:
            self._restore(last, source)
        if torn is not None:
            # A last segment left empty (its header failed, as on a full disk) is the next one.
            reuse = source != path and path.stat().st_size == 0
            header = {"reason": "torn_tail", "torn": torn.to_json()}
            self._start_segment(number if reuse else number + 1, header, reuse=reuse)
        elif last is None or source != path:  # created, then a crash before its first record
            self._start_segment(number, {"reason": "new" if number == 1 else "rotate"}, reuse=True)
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            self.number, self.size = number, os.fstat(self.fd).st_size
        return torn

    def _restore(self, raw: bytes, path: Path) -> None:
        try:
            record = decode_record(raw)
            if content_hash(record) != record["hash"]:
                raise ValueError("its hash does not match its content")
        except ValueError as exc:
            raise AuditLogError(
                f"{path}: the last record is not valid ({exc})",
                hint=f"run `sandhold audit verify {self.directory}`",
            ) from None
        self.tip = (record["seq"], record["hash"])
        self.has_calls = record.get("kind") != "segment"

    def append_call(self, *, arguments: Any, **call: Any) -> dict[str, Any]:
        """Append one call record; returns the record written (without its hash). After a
        failed write (a full disk) the chain is taken up again first, as a restart would."""
        try:
            if self.failed is not None:
                self._recover()
            return self._append_call(arguments, call)
        except OSError as exc:
            self.failed = exc
            raise AuditLogError(f"cannot write the audit log in {self.directory}: {exc}") from exc

    def _recover(self) -> None:
        """Continue the chain after a failed write: from the last complete record on disk, in
        a new segment naming the partial line the failure may have left (``resume``)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.unsynced = 0
        torn = self.resume()
        self.failed = None
        if torn is not None:
            log.warning(
                "audit log: a failed write left a partial record in %s; continuing in %s",
                torn.segment, segment_name(self.number),
            )  # fmt: skip

    def _append_call(self, arguments: Any, call: dict[str, Any]) -> dict[str, Any]:
        canonical = canonical_arguments(redacted_arguments(arguments))
        fields = {"kind": "call", **call}
        fields["args_sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
        if self.config.record_arguments:
            fields["arguments"] = json.loads(canonical)
        record = self._record(fields)
        line = encode_record(record)
        if self.has_calls and self.size + len(line[0]) > self.config.max_segment_bytes:
            self._start_segment(self.number + 1, {"reason": "rotate"})
            record = self._record(fields)
            line = encode_record(record)
        self._write(*line)
        return record

    def _record(self, fields: dict[str, Any]) -> dict[str, Any]:
        base = {"v": FORMAT_VERSION, "seq": self.tip[0] + 1, "time": _now()}
        return {**base, **fields, "prev": self.tip[1]}

    def _encode(self, fields: dict[str, Any]) -> tuple[bytes, str]:
        return encode_record(self._record(fields))

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
