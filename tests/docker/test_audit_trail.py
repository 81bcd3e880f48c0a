"""Every tool call lands in the audit log, refused ones included, without the code in clear; an
edit of the log is found by ``sandhold audit verify``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.audit._log import verify
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def records(directory: Path) -> list[dict[str, object]]:
    lines = []
    for segment in sorted(directory.glob("audit-*.jsonl")):
        lines += [json.loads(line) for line in segment.read_text().splitlines()]
    return [r for r in lines if r.get("kind") == "call"]


async def test_every_call_is_recorded_and_the_chain_verifies(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    secret = "TOP-SECRET-CODE-7731"
    async with Orchestrator(config(worker_image.tag, audit_dir=tmp_path)) as orch:
        first = await orch.call(
            "python_repl", {"operation": "execute", "code": f"'{secret}'"}, tenant="acme"
        )
        sid = first.structured["session_id"]
        await orch.call(
            "python_repl",
            {"operation": "execute", "code": "1/0", "session_id": sid},
            tenant="acme",
            task="job-7",
        )
        await orch.call("python_repl", {"operation": "nope"}, tenant="acme")
        await orch.call(
            "files", {"operation": "read", "session_id": sid, "path": "x"}, tenant="intruder"
        )
    report = verify(tmp_path)
    assert report.ok, report.problems
    calls = records(tmp_path)
    assert [
        (r["tenant"], r["task"], r["tool"], r["operation"], r["success"], r["error_type"])
        for r in calls
    ] == [
        ("acme", None, "python_repl", "execute", True, None),
        # Task job-7 may not see the tenant's own session: answered as unknown, and audited.
        ("acme", "job-7", "python_repl", "execute", False, "session_not_found"),
        ("acme", None, "python_repl", "nope", False, "invalid_argument"),
        ("intruder", None, "files", "read", False, "session_not_found"),
    ]
    assert calls[0]["session_id"] == sid
    assert secret not in await anyio.to_thread.run_sync(everything_written, tmp_path)


def everything_written(directory: Path) -> str:
    return "".join(p.read_text() for p in directory.glob("audit-*.jsonl"))


def tamper_and_verify(directory: Path) -> subprocess.CompletedProcess[str]:
    segment = sorted(directory.glob("audit-*.jsonl"))[0]
    segment.write_text(segment.read_text().replace('"success":true', '"success":false', 1))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "audit", "verify", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_an_edited_record_fails_sandhold_audit_verify(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with Orchestrator(config(worker_image.tag, audit_dir=tmp_path)) as orch:
        for code in ("1", "2", "3"):
            await orch.call("python_repl", {"operation": "execute", "code": code})
    result = await anyio.to_thread.run_sync(tamper_and_verify, tmp_path)
    assert result.returncode == 1
    assert "line" in result.stdout + result.stderr


async def test_a_call_cancelled_mid_execute_is_recorded_as_cancelled(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with Orchestrator(config(worker_image.tag, audit_dir=tmp_path)) as orch:
        created = await orch.call("python_repl", {"operation": "execute", "code": "x = 1"})
        sid = created.structured["session_id"]
        cell = {"operation": "execute", "session_id": sid, "code": "import time; time.sleep(600)"}
        with anyio.fail_after(60), anyio.move_on_after(1.0) as scope:
            await orch.call("python_repl", cell)
        assert scope.cancelled_caught
    assert verify(tmp_path).ok
    first, cancelled = records(tmp_path)
    assert (first["outcome"], first["success"]) == ("ok", True)
    assert cancelled["outcome"] == "cancelled" and cancelled["success"] is False
    assert (cancelled["operation"], cancelled["error_type"]) == ("execute", "cancelled")
    assert cancelled["session_id"] == sid and float(str(cancelled["duration_ms"])) >= 1000
