"""CPU and memory for the operations page (``_core.usage``), on the in-memory backend: a rate
from two samples on a fake clock, figures only for live sessions, sampling only while watched,
and an overview that shows the caller's sessions alone and touches none of them."""

from __future__ import annotations

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator._core.owners import task_scope
from orchestrator._core.usage import MIB, WATCH_TIMEOUT, UsageSampler
from orchestrator.backend.fake import FakeBackend
from tests.unit.test_manager_on_fake import STEP_TIMEOUT, Worker, engine, settings

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_cpu_is_the_cpu_time_between_two_samples_over_the_time_between_them(
    clock: Clock,
) -> None:
    fake = FakeBackend()
    container = fake.add_container({})
    fake.containers[container].memory_bytes = 48 * MIB
    sampler = UsageSampler(fake, lambda: {"s1": container}, clock=clock)
    await sampler.sweep()
    first = sampler.usage("s1")
    assert first is not None and first.cpu_percent is None and first.memory_mb == 48.0
    fake.containers[container].cpu_seconds = 3.0
    clock.now += 2.0
    await sampler.sweep()
    second = sampler.usage("s1")
    assert second is not None and second.cpu_percent == 150.0


async def test_figures_are_kept_only_for_live_sessions(clock: Clock) -> None:
    fake = FakeBackend()
    kept, ended = fake.add_container({}), fake.add_container({})
    live = {"kept": kept, "ended": ended}
    sampler = UsageSampler(fake, lambda: dict(live), clock=clock)
    await sampler.sweep()
    assert sampler.usage("ended") is not None
    del live["ended"]
    await fake.remove_container(ended)
    await sampler.sweep()
    assert sampler.usage("ended") is None and sampler.usage("kept") is not None


async def test_a_container_gone_before_its_sample_is_skipped(clock: Clock) -> None:
    fake = FakeBackend()
    sampler = UsageSampler(fake, lambda: {"s1": "no-such-container"}, clock=clock)
    await sampler.sweep()
    assert sampler.usage("s1") is None


async def test_sampling_goes_on_while_watched_and_stops_the_watch_timeout_after(
    clock: Clock,
) -> None:
    fake = FakeBackend()
    container = fake.add_container({})
    sampled: list[float] = []
    stats = fake.stats

    async def counting(container_id: str) -> dict[str, float]:
        sampled.append(clock.now)
        if len(sampled) % 3 == 0:
            clock.now += WATCH_TIMEOUT  # nobody asked again: this sweep is the last
        return await stats(container_id)

    fake.stats = counting  # type: ignore[method-assign]
    sampler = UsageSampler(fake, lambda: {"s1": container}, clock=clock, interval=0.0)
    with anyio.fail_after(STEP_TIMEOUT):
        async with anyio.create_task_group() as group:
            sampler.watch(group)
            sampler.watch(group)  # already sampling: no second loop
        assert len(sampled) == 3
        async with anyio.create_task_group() as group:
            sampler.watch(group)  # asked again: sampling starts again
    assert len(sampled) == 6


async def test_the_overview_shows_the_callers_sessions_and_touches_none() -> None:
    fake = engine(Worker())
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(), backend=fake) as orch:
            mine = await orch.create_session(tenant="team-a")
            with task_scope("job-1"):
                tasks = await orch.create_session(tenant="team-a")
            await orch.create_session(tenant="team-b")
            before = (mine.last_active, tasks.last_active)
            rows = orch.session_overview(tenant="team-a")
            assert {r["session_id"] for r in rows} == {mine.id, tasks.id}
            with task_scope("job-1"):
                only = orch.session_overview(tenant="team-a")
            assert [(r["session_id"], r["task"]) for r in only] == [(tasks.id, "job-1")]
            assert (mine.last_active, tasks.last_active) == before
            assert all(r["state"] == "idle" and r["tenant"] == "team-a" for r in rows)
            await orch.pause(mine.id, tenant="team-a")
            paused = {r["session_id"]: r["state"] for r in orch.session_overview(tenant="team-a")}
            assert paused[mine.id] == "paused"
            assert orch.capacity() == {"sessions": 3, "starting": 0, "max_sessions": 100}
