"""The warm pool against real containers: sessions come ready, are never reused, refill, and
are all removed when the pool shrinks or the orchestrator closes."""

from __future__ import annotations

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

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
