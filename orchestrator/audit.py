"""The audit log: append-only JSON lines, each record carrying the hash of the one before it.

``AuditLog`` (opened with ``AuditLog.open`` or ``open_audit_log``) records one line per tool
call; ``verify`` (and ``sbx audit verify``) checks a log. This module is the public face of the
audit subsystem and re-exports its names; the parts live beside it:

- ``orchestrator.audit_records``: the record format: canonical JSON, hashes, segment names.
- ``orchestrator.audit_writer``: the blocking writer (segments, rotation, torn tails) and
  ``AuditConfig``.
- ``orchestrator.audit_verify``: the streaming verifier.

Invariants:
- One writer per directory: a ``flock`` on ``.lock`` keeps a second process out, and an anyio
  lock serializes the records of this one, so file order is ``seq`` order.
- File I/O runs in a worker thread, and the writer's state changes only there, under the lock,
  after the write succeeded. Recording is shielded from cancellation: a cancelled call is
  audited too.
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
from collections.abc import AsyncIterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio

from orchestrator.audit_records import (
    FORMAT_VERSION,
    GENESIS_HASH,
    SEGMENT_NAME,
    AuditLogError,
    TornTail,
    arguments_digest,
    segment_name,
)
from orchestrator.audit_verify import MAX_PROBLEMS, AuditProblem, VerifyReport, verify
from orchestrator.audit_writer import (
    DEFAULT_MAX_SEGMENT_BYTES,
    TAIL_CHUNK,
    AuditConfig,
    SegmentWriter,
)

__all__ = [
    "DEFAULT_MAX_SEGMENT_BYTES",
    "FORMAT_VERSION",
    "GENESIS_HASH",
    "LOCK_FILE",
    "MAX_PROBLEMS",
    "SEGMENT_NAME",
    "TAIL_CHUNK",
    "AuditConfig",
    "AuditLog",
    "AuditLogError",
    "AuditProblem",
    "TornTail",
    "VerifyReport",
    "arguments_digest",
    "open_audit_log",
    "segment_name",
    "verify",
]

log = logging.getLogger(__name__)

LOCK_FILE: Final = ".lock"


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
            **_given(ran=ran, exit_status=exit_status, worker_claims=worker_claims),
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
