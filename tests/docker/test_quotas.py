"""Tenant quotas and allowed policies against real containers: concurrent creates never pass a
quota together, a refused create leaves no container, each refusal names its quota, and what is
freed can be used again."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator._core.tenants import TenantConfig, TenantQuotas, hash_key, new_key
from orchestrator.backend.base import LABEL_ORCHESTRATOR, LABEL_SESSION, LABEL_TENANT
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from orchestrator.tools import ToolResult
from tests.conftest import TEST_ORCHESTRATOR_ID
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

Args = dict[str, Any]

# Every call is bounded: a hang is a failure, not a stuck suite.
CALL_TIMEOUT = 30.0
# Twenty creates at once on a small machine: three containers are made, the rest refused.
CONCURRENT_TIMEOUT = 60.0
# Long enough for a command to be seen running, short enough not to slow the suite.
YIELD_MS = 100
CREATE: Args = {"operation": "execute", "code": "1"}


def tenant(name: str, *, policies: tuple[str, ...] | None = None, **quotas: Any) -> TenantConfig:
    return TenantConfig(
        name=name, key_sha256=hash_key(new_key()), policies=policies, quotas=TenantQuotas(**quotas)
    )


@contextlib.asynccontextmanager
async def orchestrator_for(
    image: ImageBuildResult, *tenants: TenantConfig
) -> AsyncIterator[Orchestrator]:
    # An id of its own, so that containers can be counted per orchestrator.
    own_id = f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}"
    settings = config(image.tag, orchestrator_id=own_id, tenants={t.name: t for t in tenants})
    async with Orchestrator(settings) as orch:
        yield orch


async def call(
    orch: Orchestrator, tenant: str, tool: str, args: Args, task: str | None = None
) -> ToolResult:
    with anyio.fail_after(CALL_TIMEOUT):
        return await orch.call(tool, args, tenant=tenant, task=task)


async def ok(orch: Orchestrator, tenant: str, tool: str, args: Args) -> dict[str, Any]:
    result = await call(orch, tenant, tool, args)
    assert result.structured["success"], (tenant, tool, result.structured)
    return result.structured


async def refused_for(orch: Orchestrator, tenant: str, tool: str, args: Args, quota: str) -> None:
    result = await call(orch, tenant, tool, args)
    got = (result.structured.get("error_type"), result.structured.get("quota"))
    assert got == ("quota_exceeded", quota), (tool, args, result.structured)


async def containers_of(orch: Orchestrator, tenant: str | None = None) -> list[str]:
    labels = {LABEL_ORCHESTRATOR: orch.orchestrator_id}
    if tenant is not None:
        labels[LABEL_TENANT] = tenant
    return await orch.backend.list_containers(labels)


async def test_twenty_concurrent_creates_within_a_sessions_quota_of_three_make_exactly_three(
    worker_image: ImageBuildResult,
) -> None:
    capped, other = tenant("capped", sessions=3), tenant("other", sessions=3)
    async with orchestrator_for(worker_image, capped, other) as orch:
        results: list[ToolResult] = []

        async def create(index: int) -> None:
            # From several tasks: the quota is the tenant's, whichever task asks.
            task = f"job-{index % 4}"
            results.append(await orch.call("python_repl", CREATE, tenant="capped", task=task))

        with anyio.fail_after(CONCURRENT_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for index in range(20):
                    tg.start_soon(create, index)

        made = [r.structured for r in results if r.structured["success"]]
        refused = [r.structured for r in results if not r.structured["success"]]
        assert len(made) == 3 and len(refused) == 17, [r.get("error_type") for r in refused]
        assert {(r["error_type"], r["quota"]) for r in refused} == {("quota_exceeded", "sessions")}
        # Nothing half-made: exactly the three sessions' containers exist.
        described = await orch.backend.describe_containers(
            [f"{LABEL_ORCHESTRATOR}={orch.orchestrator_id}"]
        )
        assert sorted(c.labels[LABEL_SESSION] for c in described) == sorted(
            r["session_id"] for r in made
        )
        listed = await ok(orch, "capped", "python_repl", {"operation": "list_sessions"})
        assert listed["count"] == 3

        # Another tenant is unaffected; the capped one stays full.
        await ok(orch, "other", "python_repl", CREATE)
        await refused_for(orch, "capped", "python_repl", CREATE, "sessions")
        await refused_for(
            orch, "capped", "terminal", {"operation": "run", "command": "true"}, "sessions"
        )

        # Destroying one session frees room for exactly one.
        destroy = {"operation": "destroy", "session_id": made[0]["session_id"]}
        await ok(orch, "capped", "python_repl", destroy)
        await ok(orch, "capped", "python_repl", CREATE)
        await refused_for(orch, "capped", "python_repl", CREATE, "sessions")
        assert len(await containers_of(orch, "capped")) == 3
        assert len(await containers_of(orch, "other")) == 1


async def test_memory_and_cpu_quotas_count_the_sum_of_the_sessions_limits(
    worker_image: ImageBuildResult,
) -> None:
    resources = load_policy("default").resources
    memory = tenant("memory", memory_mb=2 * resources.memory_mb)
    cpus = tenant("cpus", cpus=2 * resources.cpus)
    async with orchestrator_for(worker_image, memory, cpus) as orch:
        for name, quota in [("memory", "memory_mb"), ("cpus", "cpus")]:
            await ok(orch, name, "python_repl", CREATE)
            await ok(orch, name, "terminal", {"operation": "run", "command": "true"})
            await refused_for(orch, name, "python_repl", CREATE, quota)
            start = {"operation": "start", "command": "true", "yield_time_ms": YIELD_MS}
            await refused_for(orch, name, "terminal", start, quota)
            assert len(await containers_of(orch, name)) == 2, name


async def test_per_session_quotas_below_the_policys_limits_are_enforced(
    worker_image: ImageBuildResult,
) -> None:
    limits = load_policy("default").limits
    assert limits.terminals_per_session > 2 and limits.processes_per_session > 2
    narrow = tenant("narrow", terminals_per_session=2, processes_per_session=2)
    async with orchestrator_for(worker_image, narrow) as orch:
        sid = (await ok(orch, "narrow", "python_repl", CREATE))["session_id"]
        terminal = {
            "operation": "start",
            "command": "sleep 300",
            "session_id": sid,
            "yield_time_ms": YIELD_MS,
        }
        terminals = [(await ok(orch, "narrow", "terminal", terminal))["terminal_id"] for _ in "ab"]
        await refused_for(orch, "narrow", "terminal", terminal, "terminals_per_session")
        await ok(orch, "narrow", "terminal", {"operation": "kill", "terminal_id": terminals[0]})
        await ok(orch, "narrow", "terminal", terminal)
        await refused_for(orch, "narrow", "terminal", terminal, "terminals_per_session")

        process = {"operation": "start", "command": "sleep 300", "session_id": sid}
        processes = [(await ok(orch, "narrow", "process", process))["process_id"] for _ in "ab"]
        await refused_for(orch, "narrow", "process", process, "processes_per_session")
        await ok(orch, "narrow", "process", {"operation": "kill", "process_id": processes[0]})
        await ok(orch, "narrow", "process", process)
        await refused_for(orch, "narrow", "process", process, "processes_per_session")

        # The quota is per session: a new session has room again.
        await ok(orch, "narrow", "python_repl", {"operation": "destroy", "session_id": sid})
        fresh = (await ok(orch, "narrow", "python_repl", CREATE))["session_id"]
        await ok(orch, "narrow", "terminal", {**terminal, "session_id": fresh})
        await ok(orch, "narrow", "process", {**process, "session_id": fresh})


async def test_a_per_session_quota_of_zero_allows_no_terminal_and_no_process(
    worker_image: ImageBuildResult,
) -> None:
    none_at_all = tenant("zero", terminals_per_session=0, processes_per_session=0)
    async with orchestrator_for(worker_image, none_at_all) as orch:
        sid = (await ok(orch, "zero", "python_repl", CREATE))["session_id"]
        terminal = {
            "operation": "start",
            "command": "sleep 300",
            "session_id": sid,
            "yield_time_ms": YIELD_MS,
        }
        await refused_for(orch, "zero", "terminal", terminal, "terminals_per_session")
        process = {"operation": "start", "command": "sleep 300", "session_id": sid}
        await refused_for(orch, "zero", "process", process, "processes_per_session")


async def test_a_tenant_uses_only_its_allowed_policies(worker_image: ImageBuildResult) -> None:
    strict_only = tenant("strict-only", policies=("strict",))
    async with orchestrator_for(worker_image, strict_only) as orch:
        for tool, args in [
            ("python_repl", CREATE),
            ("python_repl", {**CREATE, "policy": "default"}),
            ("terminal", {"operation": "run", "command": "true"}),
            ("terminal", {"operation": "start", "command": "true", "policy": "default"}),
        ]:
            result = await call(orch, "strict-only", tool, args)
            assert result.structured["error_type"] == "policy", (tool, args, result.structured)
            assert result.structured["rule"] == "tenant.policies", (tool, args)
        assert await containers_of(orch) == []

        made = await ok(orch, "strict-only", "python_repl", {**CREATE, "policy": "strict"})
        listed = await ok(orch, "strict-only", "python_repl", {"operation": "list_sessions"})
        assert [(s["session_id"], s["policy"]) for s in listed["sessions"]] == [
            (made["session_id"], "strict")
        ]
        # A tenant without a policy list may use any.
        await ok(orch, "anyone", "python_repl", CREATE)
        assert len(await containers_of(orch)) == 2


async def test_a_warm_pool_never_carries_a_tenant_past_its_quota(
    worker_image: ImageBuildResult,
) -> None:
    """Quotas are checked before a pooled session is handed out, so a ready pool changes how
    fast a tenant gets a session, never how many it may hold."""
    async with orchestrator_for(worker_image, tenant("pooled", sessions=1)) as orch:
        await orch.set_pool_size("default", 2)
        with anyio.fail_after(CONCURRENT_TIMEOUT):
            while orch.pool_status()["default"]["ready"] < 2:  # noqa: ASYNC110 (no pool event)
                await anyio.sleep(0.1)
        first = await ok(orch, "pooled", "python_repl", CREATE)
        await refused_for(orch, "pooled", "python_repl", CREATE, "sessions")
        assert orch.pool_status()["default"]["ready"] >= 1  # the refusal took nothing
        listed = await ok(orch, "pooled", "python_repl", {"operation": "list_sessions"})
        assert [s["session_id"] for s in listed["sessions"]] == [first["session_id"]]


async def test_at_max_sessions_a_tenant_never_evicts_another_tenants_session(
    worker_image: ImageBuildResult,
) -> None:
    tenants = (tenant("alice", sessions=5), tenant("mallory", sessions=0), tenant("carol"))
    own_id = f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}"
    settings = config(
        worker_image.tag,
        orchestrator_id=own_id,
        tenants={t.name: t for t in tenants},
        max_sessions=1,
    )
    async with Orchestrator(settings) as orch:
        alice = (await ok(orch, "alice", "python_repl", {**CREATE, "code": "x = 1"}))["session_id"]
        # A quota of 0 is refused by its quota, before anything is evicted.
        await refused_for(orch, "mallory", "python_repl", CREATE, "sessions")
        # Within its quota but at the orchestrator's capacity, with no idle session of its own.
        await refused_for(orch, "carol", "python_repl", CREATE, "max_sessions")
        still = await ok(orch, "alice", "python_repl", {**CREATE, "code": "x", "session_id": alice})
        assert still["result_repr"] == "1"
        # Its own idle session is what makes room for a tenant at capacity.
        second = (await ok(orch, "alice", "python_repl", CREATE))["session_id"]
        assert [s["session_id"] for s in orch.list_sessions(tenant="alice")] == [second]
        assert len(await containers_of(orch)) == 1
