"""The warm pool against real containers: sessions come ready, are never reused, refill, and
are all removed when the pool shrinks, goes idle or the orchestrator closes; ``sandhold serve``
keeps one by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator._api import Orchestrator
from orchestrator._core.limits import DEFAULT_SERVE_POOL
from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config
from tests.docker.test_serve import CALL_TIMEOUT, running
from tests.docker.test_serve_ops import local_key, stop

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


async def until_ready(orch: Orchestrator, policy: str, count: int) -> None:
    with anyio.fail_after(60):
        while orch.pool_status()[policy]["ready"] != count:  # noqa: ASYNC110 (no pool event)
            await anyio.sleep(0.1)


async def containers(orch: Orchestrator) -> set[str]:
    return set(await orch.backend.list_containers({LABEL_ORCHESTRATOR: orch.orchestrator_id}))


async def test_a_session_from_the_pool_is_ready_fresh_and_never_handed_out_twice(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag, pool={"default": 2})) as orch:
        await until_ready(orch, "default", 2)
        pooled = await containers(orch)
        first = await orch.execute("secret = 'mine'\nsecret")
        second = await orch.execute("secret")
        assert first.result_repr == "'mine'"
        assert second.error_type == "NameError"  # a different, fresh interpreter
        taken = {orch.find_session(r.session_id).container_id for r in (first, second)}
        assert taken <= pooled and len(taken) == 2
        await until_ready(orch, "default", 2)  # refilled in the background
        assert len(await containers(orch)) == 4


async def test_a_pool_resized_to_zero_removes_what_it_held(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        await orch.set_pool_size("strict", 2)
        await until_ready(orch, "strict", 2)
        assert len(await containers(orch)) == 2
        await orch.set_pool_size("strict", 0)
        with anyio.fail_after(30):
            while await containers(orch):  # noqa: ASYNC110 (no engine event for removal)
                await anyio.sleep(0.1)
        session = await orch.create_session(policy="strict")  # cold, still works
        assert session.policy.name == "strict"


async def test_closing_the_orchestrator_removes_pooled_containers(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag, pool={"default": 2})) as orch:
        await until_ready(orch, "default", 2)
    async with Orchestrator(config(worker_image.tag)) as observer:
        assert await containers(observer) == set()


async def served_pools(server: Any) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {local_key(server.notice)}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
        answer = await http.get("/v1/ops/pools", headers=headers)
    assert answer.status_code == 200, answer.text
    pools: list[dict[str, Any]] = answer.json()["pools"]
    return pools


async def test_serve_with_defaults_keeps_two_warm_sessions_and_pool_0_keeps_none(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a new user gets: ``sandhold serve`` with no pool option (the test suite's
    ``SANDHOLD_POOL=0`` taken away) has filled its pool before it prints its address."""
    monkeypatch.delenv("SANDHOLD_POOL", raising=False)
    async with running(worker_image.tag, tmp_path, data_dir=tmp_path / "a") as server:
        pools = await served_pools(server)
        assert pools == [{"policy": "default", "size": DEFAULT_SERVE_POOL, "ready": 2}]
        labels = {LABEL_ORCHESTRATOR: server.orchestrator_id}
        async with Orchestrator(config(worker_image.tag)) as observer:
            pooled = await observer.backend.list_containers(labels)
        assert len(pooled) == DEFAULT_SERVE_POOL
        await stop(server)
    off = ("--pool", "0")
    async with running(worker_image.tag, tmp_path, *off, data_dir=tmp_path / "b") as server:
        assert await served_pools(server) == []
        async with Orchestrator(config(worker_image.tag)) as observer:
            labels = {LABEL_ORCHESTRATOR: server.orchestrator_id}
            assert await observer.backend.list_containers(labels) == []
        await stop(server)


async def test_an_idle_pool_drains_its_containers_and_the_next_create_refills_it(
    worker_image: ImageBuildResult,
) -> None:
    # Idle counts from when the pool was last full: long enough to see it full, then drained.
    settings = config(worker_image.tag, pool={"default": 2}, pool_idle_timeout=5.0)
    async with Orchestrator(settings) as orch:
        await until_ready(orch, "default", 2)
        with anyio.fail_after(60):
            while await containers(orch):  # noqa: ASYNC110 (no engine event for removal)
                await anyio.sleep(0.2)
        assert orch.pool_status()["default"] == {"size": 2, "ready": 0}
        session = await orch.create_session()  # a miss, built cold; it wakes the pool
        await until_ready(orch, "default", 2)
        assert len(await containers(orch)) == 3
        assert session.container_id in await containers(orch)
