"""The audit log: append-only JSON lines, each record carrying the hash of the one before it.

``AuditLog`` (opened with ``AuditLog.open`` or ``open_audit_log``) records one line per tool
call, with its ``outcome``: ``ok``, ``failed`` (the call answered with ``success: false``) or
``cancelled`` (its caller went away before the answer); ``verify`` (and ``sandhold audit verify``)
checks a log. This module is the public face of the audit subsystem and re-exports its names;
the parts live beside it:

- ``orchestrator.audit_records``: the record format: canonical JSON, hashes, segment names.
- ``orchestrator.audit_writer``: the blocking writer (segments, rotation, torn tails) and
  ``AuditConfig``.
- ``orchestrator.audit_verify``: the streaming verifier.
- ``orchestrator.audit.recent``: the last records written, per tenant, for the operations page.

Invariants:
- One writer per directory: a ``flock`` on ``.lock`` keeps a second process out, and a thread
  lock serializes the records of this one, so file order is ``seq`` order.
- File I/O runs in a worker thread, and the writer's state changes only there, under the lock,
  after the write succeeded. Recording is shielded from cancellation (a cancelled call is
  audited too) and bounded (``RECORD_TIMEOUT``): a caller stops waiting for a disk that hangs,
  while the write, if it ever gets the lock, completes whole in its thread.
- A partial last line left by a crash is recorded, never repaired: the log continues in a new
  segment whose first record names it (``AuditLog.torn_tail`` says so too).
- A hash chain alone cannot show records cut off the end or a log rewritten from some point on:
  keep ``AuditLog.head`` elsewhere and give it to ``verify(expect_head=)`` for that.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal

import anyio

from orchestrator.audit.recent import RecentRecords
from orchestrator.audit.records import (
    FORMAT_VERSION,
    GENESIS_HASH,
    SEGMENT_NAME,
    TornTail,
    arguments_digest,
    segment_name,
)
from orchestrator.audit.verify import MAX_PROBLEMS, AuditProblem, VerifyReport, verify
from orchestrator.audit.writer import (
    DEFAULT_MAX_SEGMENT_BYTES,
    TAIL_CHUNK,
    AuditConfig,
    SegmentWriter,
)
from orchestrator.errors import AuditLogError

__all__ = [
    "DEFAULT_MAX_SEGMENT_BYTES",
    "FORMAT_VERSION",
    "GENESIS_HASH",
    "LOCK_FILE",
    "MAX_PROBLEMS",
    "RECORD_TIMEOUT",
    "SEGMENT_NAME",
    "TAIL_CHUNK",
    "AuditConfig",
    "AuditLog",
    "AuditProblem",
    "Outcome",
    "TornTail",
    "VerifyReport",
    "arguments_digest",
    "open_audit_log",
    "segment_name",
    "verify",
]

log = logging.getLogger(__name__)

LOCK_FILE: Final = ".lock"
# An append and its fdatasync take milliseconds on a local disk, a few hundred records queued
# behind each other well under a second; a disk that holds a record this long is failing, and
# a call (a cancelled one above all) must not hang on it.
RECORD_TIMEOUT: Final = 10.0

Outcome = Literal["ok", "failed", "cancelled"]


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

    def __init__(self, writer: SegmentWriter, lock_fd: int, torn_tail: TornTail | None) -> None:
        self._writer = writer
        self._lock_fd = lock_fd
        # A thread lock, taken in the writing thread: a caller that stops waiting leaves the
        # write to finish, or never start, whole and in order.
        self._lock = threading.Lock()
        self._closed = False
        #: What a crash left at the end of the log when it was opened (recorded, never repaired).
        self.torn_tail = torn_tail
        #: The last records this process wrote, per tenant (``audit.recent``).
        self.recent = RecentRecords()

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
        writer = SegmentWriter(directory, config)
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
        ran: bool | None = None,
        exit_status: int | None = None,
        worker_claims: Mapping[str, Any] | None = None,
        outcome: Outcome | None = None,
        details: Mapping[str, Any] | None = None,
        call_id: str | None = None,
        egress: Mapping[str, int] | None = None,
    ) -> None:
        """Append one call record; raises ``AuditLogError`` if it cannot be written, or is not
        written within ``RECORD_TIMEOUT``. ``outcome`` defaults to what ``success`` says.
        ``details``: what an interface observed about a request it refused (kept in clear);
        ``call_id``: the call's id, as in the server's log and the REST response header;
        ``egress``: the session's egress attempts begun and ended during the call, as its proxy
        logged them (attempts, denied, bytes_sent, bytes_received)."""
        append = partial(
            self._append,
            tenant=tenant,
            task=task,
            tool=tool,
            operation=operation,
            session_id=session_id,
            success=success,
            error_type=error_type,
            outcome=outcome or ("ok" if success else "failed"),
            duration_ms=round(duration_ms, 3),
            arguments=arguments,
            **_given(
                ran=ran,
                exit_status=exit_status,
                worker_claims=worker_claims,
                details=details,
                call_id=call_id,
                egress=dict(egress) if egress else None,
            ),
        )
        with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_TIMEOUT) as bound:
            await anyio.to_thread.run_sync(append, abandon_on_cancel=True)
        if bound.cancelled_caught:
            raise AuditLogError(f"the audit log did not take a record within {RECORD_TIMEOUT:g} s")

    async def record_begin(
        self,
        *,
        tenant: str,
        tool: str,
        operation: str | None,
        session_id: str | None,
        call_id: str,
    ) -> None:
        """Say that a call begins (``kind: call_begin``), before it runs: a process stopped
        during it (``kill -9``) leaves this record with no ``call`` record of its ``call_id``,
        which ``verify`` names. Bounded and shielded like ``record``."""
        append = partial(
            self._append,
            kind="call_begin",
            tenant=tenant,
            tool=tool,
            operation=operation,
            session_id=session_id,
            arguments={},
            call_id=call_id,
            recent=False,
        )
        with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_TIMEOUT) as bound:
            await anyio.to_thread.run_sync(append, abandon_on_cancel=True)
        if bound.cancelled_caught:
            raise AuditLogError(f"the audit log did not take a record within {RECORD_TIMEOUT:g} s")

    def _append(self, *, recent: bool = True, **call: Any) -> None:
        with self._lock:
            if self._closed:
                raise AuditLogError("the audit log is closed")
            written = self._writer.append_call(**call)
            if recent:
                self.recent.add(written)

    async def aclose(self) -> None:
        """Flush and close; idempotent."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._close)

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._writer.close()
            finally:
                os.close(self._lock_fd)

    async def __aenter__(self) -> AuditLog:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _given(**fields: Any) -> dict[str, Any]:
    """The optional fields of a call record that have a value; a record holds no nulls for them."""
    return {name: value for name, value in fields.items() if value is not None}


@contextlib.asynccontextmanager
async def open_audit_log(
    path: str | os.PathLike[str], config: AuditConfig | None = None
) -> AsyncIterator[AuditLog]:
    """``AuditLog.open`` as an async context manager that closes the log on exit."""
    async with await AuditLog.open(path, config) as audit:
        yield audit
