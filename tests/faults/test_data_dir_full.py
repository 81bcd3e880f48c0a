"""sandhold's data directory fills up (its registry and audit log on a small tmpfs the test mounts
and fills): a call that must write refuses clearly (``storage_full``, naming the file, never
``internal``) and leaves nothing half-made; calls that need no write go on; the registry is
never corrupt (SQLite's integrity check), the audit chain verifies, and work resumes once there
is room again."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.faults.conftest import FaultCase
from tests.faults.harness import faulted

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

# Room for the registry and a few segments of audit log, and little else.
TMPFS_SIZE = "8m"
FILL_CHUNK = 64 * 1024
# A tmpfs allocates whole pages: a page holds about ten records.
AUDIT_FILLING_CALLS = 30
# Verifying a few small segments takes a second, most of it the interpreter starting.
VERIFY_TIMEOUT = 120.0


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(path: Path) -> Path:
    """Write ``path/filler`` until the disk says it is full."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = b"\0" * FILL_CHUNK
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    return filler


def integrity(registry: Path) -> str:
    with contextlib.closing(sqlite3.connect(f"file:{registry}?mode=ro", uri=True)) as db:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])


async def test_a_full_data_directory_refuses_what_must_be_written_and_resumes_after(
    engine: FaultCase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_disk(tmp_path / "data") as data:
        registry, audit = data / "registry.db", data / "audit"
        async with faulted(engine, tmp_path, registry_path=registry, audit_dir=audit) as f:
            kept = await f.rest("python_repl", operation="execute", code="x = 41")
            ended = await f.rest("python_repl", operation="execute", code="1")
            assert kept["success"] and ended["success"], (kept, ended)
            filler = fill(data)

            refused = await f.rest("python_repl", operation="execute", code="1 + 1")
            assert refused["error_type"] == "storage_full", refused
            assert refused["_status"] == 507 and str(registry) in refused["error_message"]
            status, ready = await f.readyz()
            assert status == 503 and "registry" in ready["checks"]["registry"], ready
            # What needs no write of ours goes on: a cell in a live session (its history row
            # is best effort), and ending a session (its container goes whatever the disk says).
            cell = await f.rest(
                "python_repl", operation="execute", code="x", session_id=kept["session_id"]
            )
            assert cell["success"] and cell["result_repr"] == "41", cell
            gone = await f.rest("python_repl", operation="destroy", session_id=ended["session_id"])
            assert gone["success"], gone
            assert len(engine.leftovers()["containers"]) == 1, engine.leftovers()
            # Past the room left in the last page of its segment, the audit log cannot write:
            # the calls are answered (they happened), the failure is logged.
            for _ in range(AUDIT_FILLING_CALLS):
                listed = await f.rest("python_repl", operation="list_sessions")
                assert listed["success"], listed
            assert "cannot write the audit log" in caplog.text

            filler.unlink()
            again = await f.rest("python_repl", operation="execute", code="6 * 7")
            assert again["success"] and again["result_repr"] == "42", again
            status, ready = await f.readyz()
            assert status == 200, ready
            state = await f.rest(
                "python_repl", operation="execute", code="x", session_id=kept["session_id"]
            )
            assert state["success"] and state["result_repr"] == "41", state

        assert integrity(registry) == "ok"
        with anyio.fail_after(VERIFY_TIMEOUT):
            verified = await anyio.run_process(
                [sys.executable, "-m", "orchestrator.cli", "audit", "verify", str(audit)],
                check=False,
            )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        # The log took up its chain again: the call made once there was room is in it.
        records = "".join(p.read_text() for p in sorted(audit.glob("*.jsonl")))
        assert again["session_id"] in records
