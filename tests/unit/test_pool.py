"""WarmPool's bookkeeping with fake sessions (pure logic; the real thing is in tests/docker)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from orchestrator._core.pool import WarmPool
from orchestrator.policy.model import load_policy

pytestmark = pytest.mark.anyio


def make_pool(size: int, lifetime: float, built: list[Any], discarded: list[str]) -> WarmPool:
    policy = load_policy("default")
    policy = policy.model_copy(
        update={
            "timeouts": policy.timeouts.model_copy(update={"max_lifetime_s": lifetime, "idle_s": 1})
        }
    )

    async def build(policy: Any) -> Any:
        session = SimpleNamespace(id=f"s{len(built)}", started=time.monotonic())
        built.append(session)
        return session

    async def discard(session: Any, reason: str) -> None:
        discarded.append(session.id)

    return WarmPool(policy, size, build=build, discard=discard)


async def test_the_pool_fills_hands_each_session_out_once_and_refills() -> None:
    built: list[Any] = []
    discarded: list[str] = []
    pool = make_pool(2, 3600, built, discarded)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        with anyio.fail_after(5):
            while pool.ready < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        first, second = pool.take_nowait(), pool.take_nowait()
        assert first is not None and second is not None and first is not second
        with anyio.fail_after(5):
            while pool.ready < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert len(built) == 4
        tg.cancel_scope.cancel()
    assert sorted(discarded) == ["s2", "s3"]  # what was still pooled is removed on exit


async def test_a_session_past_half_its_lifetime_is_never_handed_out() -> None:
    built: list[Any] = []
    discarded: list[str] = []
    pool = make_pool(1, 10, built, discarded)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        with anyio.fail_after(5):
            while pool.ready < 1:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        built[0].started -= 6  # aged past half of its 10 s lifetime
        taken = pool.take_nowait()
        assert taken is None
        with anyio.fail_after(5):
            while "s0" not in discarded or pool.ready < 1:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert pool.take_nowait() is built[1]
        tg.cancel_scope.cancel()
