"""``sandhold ps`` and ``sandhold kill`` see and end sandboxes from the engine alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def sandhold(*args: str, image: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SANDHOLD_EXTRA_LABELS=f"{TEST_RUN_LABEL}={RUN_ID}")
    if image:
        env["SANDHOLD_IMAGE"] = image
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


async def test_ps_lists_a_live_session_with_owner_and_policy_and_kill_ends_it(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        session = await orch.create_session(policy="strict", tenant="ops-test")
        listed = await anyio.to_thread.run_sync(sandhold, "ps", "--json")
        assert listed.returncode == 0, listed.stderr
        entries = {e["session_id"]: e for e in json.loads(listed.stdout)}
        mine = entries[session.id]
        assert (mine["tenant"], mine["policy"], mine["state"]) == ("ops-test", "strict", "running")
        assert mine["memory_mb"] is not None and mine["memory_mb"] > 0

        killed = await anyio.to_thread.run_sync(sandhold, "kill", session.id)
        assert killed.returncode == 0, killed.stderr
        again = await anyio.to_thread.run_sync(sandhold, "ps", "--json")
        assert session.id not in {e["session_id"] for e in json.loads(again.stdout)}


async def test_ps_names_the_owner_the_registry_knows_for_a_session_from_the_pool(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    """A pooled container is labelled with the pool's tenant when it is made; the registry
    knows who it was handed to, and ``sandhold ps --registry`` says so."""
    registry = tmp_path / "registry.db"
    settings = config(worker_image.tag, registry_path=registry, pool={"default": 1})
    async with Orchestrator(settings) as orch:
        with anyio.fail_after(60):
            while orch.pool_status()["default"]["ready"] < 1:  # noqa: ASYNC110 (no pool event)
                await anyio.sleep(0.1)
        made = await orch.call(
            "python_repl", {"operation": "execute", "code": "1"}, tenant="ops-test", task="t9"
        )
        session_id = made.structured["session_id"]
        plain = await anyio.to_thread.run_sync(sandhold, "ps", "--json")
        known = await anyio.to_thread.run_sync(
            sandhold, "ps", "--json", "--registry", str(registry)
        )
        assert known.returncode == 0, known.stderr
        by_label = {e["session_id"]: e for e in json.loads(plain.stdout)}[session_id]
        by_registry = {e["session_id"]: e for e in json.loads(known.stdout)}[session_id]
        assert (by_label["tenant"], by_label["task"]) == ("pool", None)
        assert (by_registry["tenant"], by_registry["task"]) == ("ops-test", "t9")


def test_kill_of_an_unknown_session_is_session_not_found_with_exit_status_2() -> None:
    result = sandhold("kill", "no-such-session")
    assert result.returncode == 2
    assert result.stderr.startswith("error: session_not_found:")


async def test_a_session_whose_container_was_removed_outside_sandhold_ends_cleanly(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        first = await orch.call("python_repl", {"operation": "execute", "code": "x = 1"})
        sid = first.structured["session_id"]
        killed = await anyio.to_thread.run_sync(sandhold, "kill", sid)
        assert killed.returncode == 0, killed.stderr
        for _ in range(2):  # the first call may see the worker die; after that, it is gone
            result = await orch.call("files", {"operation": "read", "session_id": sid, "path": "x"})
        assert result.structured["error_type"] == "session_lost"
        assert "disappeared" in result.structured["error_message"]
        assert orch.list_sessions() == []
        assert (await orch.call("python_repl", {"operation": "execute", "code": "1"})).structured[
            "success"
        ]


@pytest.mark.parametrize(
    ("args", "status", "out", "err"),
    [
        (["--code", "print(6 * 7)"], 0, "42\n", ""),
        (["--code", "1 / 0"], 1, "", "ZeroDivisionError"),
        (["--command", "echo hi; exit 3"], 3, "hi\n", ""),
        (["--command", "sudo id"], 2, "", "policy"),
        (["--command", "sleep 30", "--timeout", "2"], 124, "", "timeout"),
        (["--code", "1", "--command", "true"], 2, "", "invalid_argument"),
    ],
    ids=["code", "code-fails", "command-status", "policy", "timeout", "both"],
)
def test_run_passes_the_exit_status_through(
    worker_image: ImageBuildResult, args: list[str], status: int, out: str, err: str
) -> None:
    result = sandhold("run", *args, image=worker_image.tag)
    assert result.returncode == status, result.stderr
    assert result.stdout == out
    assert err in result.stderr
