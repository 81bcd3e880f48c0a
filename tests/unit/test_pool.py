"""WarmPool's bookkeeping with fake sessions (pure logic; the real thing is in tests/docker)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from orchestrator._core.config import OrchestratorConfig
from orchestrator._core.limits import DEFAULT_SERVE_POOL
from orchestrator._core.pool import WarmPool
from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.model import load_policy

pytestmark = pytest.mark.anyio


def make_pool(
    size: int,
    lifetime: float,
    built: list[Any],
    discarded: list[str],
    idle_timeout: float | None = None,
) -> WarmPool:
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

    return WarmPool(policy, size, build=build, discard=discard, idle_timeout=idle_timeout)


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


async def until(condition: Any) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 (no pool event)
            await anyio.sleep(0.01)


async def test_an_idle_pool_drains_to_zero_and_the_next_take_fills_it_again() -> None:
    built: list[Any] = []
    discarded: list[str] = []
    pool = make_pool(2, 3600, built, discarded, idle_timeout=0.3)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        await until(lambda: pool.ready == 2)
        assert pool.target == 2
        await until(lambda: len(discarded) == 2)  # nothing taken for 0.3 s
        assert pool.ready == 0 and pool.target == 0 and pool.size == 2
        assert sorted(discarded) == ["s0", "s1"] and len(built) == 2  # none rebuilt while idle
        assert pool.take_nowait() is None  # the take that wakes it is a miss, built cold
        assert pool.target == 2
        await until(lambda: pool.ready == 2)
        assert len(built) == 4
        taken = pool.take_nowait()  # a take keeps it warm
        assert taken is built[2]
        tg.cancel_scope.cancel()


async def test_without_an_idle_timeout_the_pool_stays_full() -> None:
    built: list[Any] = []
    discarded: list[str] = []
    pool = make_pool(1, 3600, built, discarded)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        await until(lambda: pool.ready == 1)
        pool._active_at -= 10_000  # as if untouched for hours
        assert pool.target == 1
        tg.cancel_scope.cancel()
    assert len(built) == 1


def test_serve_and_mcp_keep_the_default_pool_unless_told_and_none_for_a_policy_file() -> None:
    assert OrchestratorConfig().pool == {}  # the Python API keeps none unless asked
    default = OrchestratorConfig().with_default_pool(None, 300.0)
    assert default.pool == {"default": DEFAULT_SERVE_POOL} and default.pool_idle_timeout == 300.0
    assert OrchestratorConfig().with_default_pool(0, 300.0).pool == {}
    assert OrchestratorConfig(default_policy="strict").with_default_pool(4, 60.0).pool == {
        "strict": 4
    }
    from_file = OrchestratorConfig(default_policy="/etc/sandhold/mine.toml")
    assert from_file.with_default_pool(None, 300.0).pool == {}
    assert from_file.with_default_pool(0, 300.0).pool == {}
    with pytest.raises(InvalidArgumentError, match="--pool needs a policy name"):
        from_file.with_default_pool(2, 300.0)
