"""The session tool's set_timeout, metrics and metadata, through the tool contract against real
containers: a changed end ends the session (and never passes its policy's maximum lifetime),
metrics answer the container's figures as the engine counts them, and metadata given at create
comes back with the session, bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator._core.session_control import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_BYTES,
)
from orchestrator.images import ImageBuildResult
from tests.docker.test_lifecycle import wait_until_ended
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# A few calls on one or two sessions; the engine's stats take about a second each.
SCENARIO_TIMEOUT = 60.0
LIFETIME_POLICY = 'name = "short"\nextends = "default"\n[timeouts]\nmax_lifetime_s = 600\n'
MIB = 1024 * 1024


@pytest.fixture
async def orch(worker_image: ImageBuildResult, tmp_path: Path) -> AsyncIterator[Orchestrator]:
    (tmp_path / "short.toml").write_text(LIFETIME_POLICY)
    settings = config(worker_image.tag, policy_dirs=(tmp_path,), reap_interval=0.2)
    async with Orchestrator(settings) as orchestrator:
        yield orchestrator


async def session_call(
    orch: Orchestrator, tenant: str | None = None, **args: Any
) -> dict[str, Any]:
    return (await orch.call("session", args, tenant=tenant)).structured


async def create(orch: Orchestrator, **args: Any) -> str:
    answer = await session_call(orch, operation="create", policy="short", **args)
    assert answer["success"], answer
    return str(answer["session_id"])


def listed(orch: Orchestrator) -> dict[str, dict[str, Any]]:
    return {row["session_id"]: row for row in orch.list_sessions()}


async def test_a_session_ends_when_the_timeout_it_was_given_runs_out(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await create(orch)
        kept = await create(orch)
        answer = await session_call(orch, operation="set_timeout", session_id=sid, timeout_s=1)
        assert answer["success"] and answer["timeout_s"] == 1.0, answer
        assert 590 < answer["max_timeout_s"] <= 600
        assert "set_timeout" in await wait_until_ended(orch, sid)
        assert kept in listed(orch)


async def test_a_timeout_can_be_moved_later_again_within_the_lifetime(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await create(orch)
        await session_call(orch, operation="set_timeout", session_id=sid, timeout_s=1)
        later = await session_call(orch, operation="set_timeout", session_id=sid, timeout_s=300)
        assert later["success"], later
        await anyio.sleep(2)  # many reaper rounds past the first end
        assert sid in listed(orch)


async def test_a_timeout_past_the_policys_maximum_lifetime_is_refused(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await create(orch)
        refused = await session_call(orch, operation="set_timeout", session_id=sid, timeout_s=601)
        assert (refused["error_type"], refused["rule"]) == ("policy", "timeouts.max_lifetime_s")
        for bad in (0, -5, "soon", True):
            wrong = await session_call(orch, operation="set_timeout", session_id=sid, timeout_s=bad)
            assert wrong["error_type"] == "invalid_argument", (bad, wrong)
        await anyio.sleep(1)  # reaper rounds: nothing above changed its end
        assert sid in listed(orch)


async def test_metrics_answer_the_containers_cpu_and_memory(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await create(orch)
        first = await session_call(orch, operation="metrics", session_id=sid)
        assert first["success"] and first["cpu_percent"] is None, first
        policy = orch.policy("short")
        assert first["memory_limit_bytes"] == policy.resources.memory_mb * MIB
        assert 0 < first["memory_bytes"] < first["memory_limit_bytes"]
        assert first["pids"] >= 1

        burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
        assert (await orch.execute(burn, session_id=sid)).success
        second = await session_call(orch, operation="metrics", session_id=sid)
        assert second["cpu_seconds"] >= first["cpu_seconds"] + 0.4, (first, second)
        assert second["cpu_percent"] is not None and second["cpu_percent"] > 0


async def test_metadata_given_at_create_is_listed_with_the_session(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        made = await session_call(
            orch, operation="create", policy="short", metadata={"owner": "ci", "run": "ünï ✓"}
        )
        plain = await create(orch)
        assert made["metadata"] == {"owner": "ci", "run": "ünï ✓"}
        rows = listed(orch)
        assert rows[made["session_id"]]["metadata"] == {"owner": "ci", "run": "ünï ✓"}
        assert rows[plain]["metadata"] == {}
        repl_listing = (await orch.call("python_repl", {"operation": "list_sessions"})).structured
        assert {s["session_id"]: s["metadata"] for s in repl_listing["sessions"]} == {
            made["session_id"]: {"owner": "ci", "run": "ünï ✓"},
            plain: {},
        }


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "v" for i in range(MAX_METADATA_KEYS + 1)},
        {"k" * (MAX_METADATA_KEY_CHARS + 1): "v"},
        {"": "v"},
        {"k": "é" * (MAX_METADATA_VALUE_BYTES // 2 + 1)},
        {"k": 1},
        ["k", "v"],
    ],
)
async def test_metadata_out_of_bounds_is_refused_and_makes_no_session(
    orch: Orchestrator, metadata: Any
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        refused = await session_call(orch, operation="create", policy="short", metadata=metadata)
        assert refused["error_type"] == "invalid_argument", refused
        assert listed(orch) == {}


async def test_metadata_at_its_bounds_is_kept_whole(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        metadata = {
            f"{i:02d}" + "k" * (MAX_METADATA_KEY_CHARS - 2): "v" * MAX_METADATA_VALUE_BYTES
            for i in range(MAX_METADATA_KEYS)
        }
        made = await session_call(orch, operation="create", policy="short", metadata=metadata)
        assert made["success"], made
        assert listed(orch)[made["session_id"]]["metadata"] == metadata


async def test_another_tenants_session_is_not_found_for_timeout_and_metrics(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await create(orch)
        for args in (
            {"operation": "set_timeout", "session_id": sid, "timeout_s": 1},
            {"operation": "metrics", "session_id": sid},
            {"operation": "metrics", "session_id": "no-such-session"},
        ):
            answer = await session_call(orch, tenant="someone-else", **args)
            assert answer["error_type"] == "session_not_found", answer
        await anyio.sleep(1)
        assert sid in listed(orch)
