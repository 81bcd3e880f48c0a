"""``sbx ps`` and ``sbx kill`` see and end sandboxes from the engine alone."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import pytest

from orchestrator.images import ImageBuildResult
from orchestrator.orchestrator import Orchestrator
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def sbx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_ps_lists_a_live_session_with_owner_and_policy_and_kill_ends_it(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        session = await orch.create_session(policy="strict", tenant="ops-test")
        listed = await anyio.to_thread.run_sync(sbx, "ps", "--json")
        assert listed.returncode == 0, listed.stderr
        entries = {e["session_id"]: e for e in json.loads(listed.stdout)}
        mine = entries[session.id]
        assert (mine["tenant"], mine["policy"], mine["state"]) == ("ops-test", "strict", "running")
        assert mine["memory_mb"] is not None and mine["memory_mb"] > 0

        killed = await anyio.to_thread.run_sync(sbx, "kill", session.id)
        assert killed.returncode == 0, killed.stderr
        again = await anyio.to_thread.run_sync(sbx, "ps", "--json")
        assert session.id not in {e["session_id"] for e in json.loads(again.stdout)}


def test_kill_of_an_unknown_session_is_session_not_found_with_exit_status_2() -> None:
    result = sbx("kill", "no-such-session")
    assert result.returncode == 2
    assert result.stderr.startswith("error: session_not_found:")


async def test_a_session_whose_container_was_removed_outside_sbx_ends_cleanly(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        first = await orch.call("python_repl", {"operation": "execute", "code": "x = 1"})
        sid = first.structured["session_id"]
        killed = await anyio.to_thread.run_sync(sbx, "kill", sid)
        assert killed.returncode == 0, killed.stderr
        for _ in range(2):  # the first call may see the worker die; after that, it is gone
            result = await orch.call("files", {"operation": "read", "session_id": sid, "path": "x"})
        assert result.structured["error_type"] == "session_not_found"
        assert "disappeared" in result.structured["error_message"]
        assert orch.list_sessions() == []
        assert (await orch.call("python_repl", {"operation": "execute", "code": "1"})).structured[
            "success"
        ]
