"""The session manager's own logic, through ``Orchestrator``, on the in-memory backend: what
start reaps, the labels a session carries, that a failed create leaves nothing, eviction at
``max_sessions``, pause bookkeeping, sessions ended when their container stops or vanishes, and
teardown. The fake's worker answers the handshake and requests of ``session/repl/protocol.py``;
how a real worker, container and engine behave is tested in tests/docker."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator._core.lifecycle import MAX_REAP_INTERVAL, MIN_REAP_INTERVAL, reap_interval
from orchestrator.backend.base import (
    LABEL_ORCHESTRATOR,
    LABEL_POLICY_NAME,
    LABEL_SESSION,
    LABEL_TENANT,
    LEGACY_LABEL_ORCHESTRATOR,
)
from orchestrator.backend.fake import FakeBackend, FakeProcess, ProgramRun
from orchestrator.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    PolicyViolationError,
    ProcessCrashedError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.session.repl.protocol import PROTOCOL_VERSION
from orchestrator.session.repl.worker_process import PID_ANNOUNCER, READY_TIMEOUT

pytestmark = pytest.mark.anyio

ORCHESTRATOR_ID = "orch-unit"
EXTRA_LABEL = "unit.run"
# Nothing here waits on a container; a second is far more than any of it takes.
STEP_TIMEOUT = 5.0
KILL = ("/bin/sh", "-c", 'kill -s "$1" "$2"')


class Worker:
    """A scripted REPL worker: it announces its pid, sends the ready frame, and answers each
    request; ``requests`` keeps what it was asked."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, process: FakeProcess) -> ProgramRun:
        process.write(f"sandhold-pid {process.pid}\n".encode())
        ready = {"type": "ready", "pid": process.pid, "protocol": PROTOCOL_VERSION, "python": "3"}
        process.write(json.dumps(ready).encode() + b"\n")
        pending = b""
        while (data := (yield)) is not None:
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                self.requests.append(request)
                process.write(json.dumps(self.reply(request)).encode() + b"\n")
        return 0

    def reply(self, request: dict[str, Any]) -> dict[str, Any]:
        frame = {"type": "reply", "id": request["id"], "ok": True}
        if request["op"] == "execute":
            frame |= {
                "success": True,
                "stdout": f"ran {request['code']}\n",
                "execution_time_ms": 1.0,
                "cpu_time_ms": 1.0,
                "peak_memory_mb": 1.0,
            }
        return frame


def refusing_worker(process: FakeProcess) -> int:
    process.write(f"sandhold-pid {process.pid}\n".encode())
    process.write(b'{"type": "fatal", "error_message": "no interpreter here"}\n')
    return 1


def engine(worker: Any) -> FakeBackend:
    backend = FakeBackend()
    backend.program(PID_ANNOUNCER, worker)

    def kill(process: FakeProcess) -> int:
        name, pid = process.argv[4], int(process.argv[5])
        if name == "KILL":
            backend.kill(process.container.id, pid)
        return 0

    backend.program(KILL, kill)
    return backend


def settings(**overrides: Any) -> OrchestratorConfig:
    base: dict[str, Any] = {
        "image": "fake-image",
        "orchestrator_id": ORCHESTRATOR_ID,
        "extra_labels": {EXTRA_LABEL: "yes"},
    }
    return OrchestratorConfig(**(base | overrides))


@pytest.fixture
def worker() -> Worker:
    return Worker()


@pytest.fixture
def fake(worker: Worker) -> FakeBackend:
    return engine(worker)


@pytest.fixture
async def orch(fake: FakeBackend) -> AsyncIterator[Orchestrator]:
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(), backend=fake) as started:
            yield started


async def test_start_reaps_only_the_containers_of_its_id_that_the_registry_does_not_know(
    fake: FakeBackend,
) -> None:
    ours = fake.add_container({LABEL_ORCHESTRATOR: ORCHESTRATOR_ID, LABEL_SESSION: "gone"})
    stopped = fake.add_container({LABEL_ORCHESTRATOR: ORCHESTRATOR_ID}, status="exited")
    legacy = fake.add_container({LEGACY_LABEL_ORCHESTRATOR: ORCHESTRATOR_ID})
    others = fake.add_container({LABEL_ORCHESTRATOR: "another-orchestrator"})
    unlabelled = fake.add_container({})
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(), backend=fake) as orch:
            assert sorted(orch.last_reconcile.reaped) == sorted([ours, stopped, legacy])
            assert sorted(fake.containers) == sorted([others, unlabelled])


async def test_a_session_is_a_container_labelled_with_its_identity(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    session = await orch.create_session(tenant="team-a")
    labels = fake.containers[session.container_id].labels
    assert labels[LABEL_SESSION] == session.id
    assert labels[LABEL_TENANT] == "team-a"
    assert labels[LABEL_ORCHESTRATOR] == ORCHESTRATOR_ID
    assert labels[LABEL_POLICY_NAME] == "default"
    assert labels[EXTRA_LABEL] == "yes"
    found = await fake.list_containers({LABEL_SESSION: session.id})
    assert found == [session.container_id]


async def test_destroy_removes_the_container_and_a_second_destroy_changes_nothing(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    session = await orch.create_session()
    assert await orch.destroy(session.id) is True
    assert session.container_id not in fake.containers
    assert await orch.destroy(session.id) is False
    with pytest.raises(SessionNotFoundError):
        orch.find_session(session.id)


async def test_execute_goes_to_the_worker_and_its_reply_comes_back(
    orch: Orchestrator, worker: Worker
) -> None:
    result = await orch.execute("1 + 1")
    assert result.success and result.created_new_session
    assert result.stdout == "ran 1 + 1\n"
    assert [(r["op"], r["code"]) for r in worker.requests] == [("execute", "1 + 1")]


async def test_a_worker_that_refuses_to_start_leaves_no_container() -> None:
    fake = engine(refusing_worker)
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(), backend=fake) as orch:
            with pytest.raises(ProcessCrashedError):
                await orch.create_session()
            assert fake.containers == {}
            assert orch.list_sessions() == []


async def test_a_policy_whose_runtime_the_engine_lacks_creates_nothing(
    fake: FakeBackend, tmp_path: Path
) -> None:
    (tmp_path / "gvisor.toml").write_text('extends = "default"\nruntime = "runsc"\n')
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(policy_dirs=(tmp_path,)), backend=fake) as orch:
            with pytest.raises(BackendUnavailableError) as refused:
                await orch.create_session(policy="gvisor")
            assert refused.value.code == "backend_unavailable"
            assert fake.containers == {}


async def test_at_max_sessions_the_callers_least_recent_idle_session_makes_room(
    fake: FakeBackend,
) -> None:
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(max_sessions=2), backend=fake) as orch:
            older = await orch.create_session(tenant="team-a")
            newer = await orch.create_session(tenant="team-a")
            older.last_active = newer.last_active - 60
            third = await orch.create_session(tenant="team-a")
            assert older.container_id not in fake.containers
            assert {newer.container_id, third.container_id} <= set(fake.containers)

            with pytest.raises(QuotaExceededError) as refused:
                await orch.create_session(tenant="team-b")
            assert refused.value.quota == "max_sessions"
            assert len(fake.containers) == 2


async def test_pause_freezes_the_container_and_the_next_call_thaws_it(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    session = await orch.create_session()
    assert await orch.pause(session.id) is True
    assert fake.containers[session.container_id].status == "paused"
    assert await orch.pause(session.id) is False
    result = await orch.execute("x = 1", session_id=session.id)
    assert result.success and not result.state_reset
    assert fake.containers[session.container_id].status == "running"
    assert await orch.resume(session.id) is False


async def test_a_container_stopped_from_outside_ends_its_session_at_the_next_reconcile(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    kept = await orch.create_session()
    stopped = await orch.create_session()
    fake.stop(stopped.container_id)
    report = await orch.reconcile()
    assert report.forgotten == [stopped.id]
    assert stopped.container_id not in fake.containers
    with pytest.raises(SessionNotFoundError):
        orch.find_session(stopped.id)
    assert orch.find_session(kept.id) is kept


async def test_a_call_on_a_session_whose_container_vanished_says_so_and_ends_it(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    session = await orch.create_session()
    await fake.remove_container(session.container_id)
    result = await orch.execute("1", session_id=session.id)
    assert result.error_type == "process_crashed" and result.state_reset
    assert "its container is gone" in (result.error_message or "")
    arguments = {"operation": "execute", "session_id": session.id, "code": "1"}
    again = await orch.call("python_repl", arguments)
    assert again.structured["error_type"] == "session_lost"


async def test_closing_the_manager_removes_every_container_it_made(fake: FakeBackend) -> None:
    foreign = fake.add_container({LABEL_ORCHESTRATOR: "another-orchestrator"})
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(), backend=fake) as orch:
            for _ in range(3):
                await orch.create_session()
            assert len(fake.containers) == 4
    assert list(fake.containers) == [foreign]
    assert fake.processes == {}


async def test_an_engine_that_does_not_answer_fails_the_start(fake: FakeBackend) -> None:
    fake.reachable = False
    orch = Orchestrator(settings(), backend=fake)
    with pytest.raises(BackendUnavailableError):
        await orch.start()
    await orch.aclose()


async def test_a_session_env_the_policy_refuses_creates_nothing(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    for env in ({"LD_PRELOAD": "/workspace/x.so"}, {"PYTHONPATH": "/workspace"}):
        with pytest.raises(PolicyViolationError):
            await orch.create_session(env=env)
    with pytest.raises(InvalidArgumentError):
        await orch.create_session(env={"BAD NAME": "x"})
    assert fake.containers == {}
    assert orch.list_sessions() == []


async def test_a_session_env_reaches_its_shell_terminals_and_processes(orch: Orchestrator) -> None:
    session = await orch.create_session(env={"A": "1"})
    assert session.env == {"A": "1"}
    for part in (session.shell, session.terminals, session.processes):
        assert part.session_env == {"A": "1"}


async def test_a_pooled_session_gets_the_env_of_the_call_that_takes_it(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    await orch.set_pool_size("default", 1)
    with anyio.fail_after(STEP_TIMEOUT):
        while orch.pool_status()["default"]["ready"] < 1:  # noqa: ASYNC110 (no pool event)
            await anyio.sleep(0.01)
    pooled = set(fake.containers)
    session = await orch.create_session(env={"TOKEN": "t"})
    assert session.container_id in pooled
    assert session.env == {"TOKEN": "t"} and session.shell.session_env == {"TOKEN": "t"}


async def test_session_env_is_refused_for_an_existing_session(orch: Orchestrator) -> None:
    session = await orch.create_session()
    with pytest.raises(InvalidArgumentError):
        await orch.open_session(session.id, session_env={"A": "1"})


async def test_a_lifetime_that_ends_with_pause_pauses_the_session_and_a_call_renews_it(
    orch: Orchestrator, fake: FakeBackend
) -> None:
    session = await orch.create_session()
    await orch.set_timeout(session.id, 60, end_action="pause")
    session.ends_at = time.monotonic() - 1  # its end has come
    await orch.reaper.reap_one(session)
    assert session.paused and session.ends_at is None and not session.closed
    assert fake.containers[session.container_id].status == "paused"
    session.last_active -= session.policy.timeouts.idle_s + 1  # and it is long idle
    await orch.reaper.reap_one(session)
    assert not session.closed  # it waits for its resume

    [kept] = [r.settings for r in orch._registry.sessions() if r.id == session.id]
    assert kept is not None and kept.ends_at is None and kept.end_action == "pause"

    before = time.monotonic()
    assert (await orch.execute("x = 1", session_id=session.id)).success
    assert fake.containers[session.container_id].status == "running"
    assert session.ends_at is not None and before + 60 <= session.ends_at <= time.monotonic() + 60
    [kept] = [r.settings for r in orch._registry.sessions() if r.id == session.id]
    assert kept is not None and kept.ends_at is not None  # a restart keeps the renewed end
    assert time.time() + 50 < kept.ends_at <= time.time() + 60


async def test_a_lifetime_that_ends_with_end_still_ends_the_session(orch: Orchestrator) -> None:
    session = await orch.create_session()
    await orch.set_timeout(session.id, 60, end_action="pause")
    await orch.set_timeout(session.id, 60, end_action="end")
    session.ends_at = time.monotonic() - 1
    await orch.reaper.reap_one(session)
    assert session.closed
    with pytest.raises(SessionNotFoundError, match="set_timeout"):
        orch.find_session(session.id)


async def test_an_unknown_end_action_changes_nothing(orch: Orchestrator) -> None:
    session = await orch.create_session()
    with pytest.raises(InvalidArgumentError):
        await orch.set_timeout(session.id, 60, end_action="kill")
    assert session.ends_at is None and session.lifetime_end_action == "end"


async def test_repl_execute_refuses_what_its_policy_refuses_whoever_calls_it(
    orch: Orchestrator, worker: Worker
) -> None:
    session = await orch.create_session()
    limit = session.policy.timeouts.max_command_s
    with pytest.raises(InvalidArgumentError):
        await session.repl.execute("1", timeout=limit + 1)
    with pytest.raises(PolicyViolationError) as denied:
        await session.repl.execute("1", env={"PYTHONPATH": "/tmp"})
    assert denied.value.rule == "env.deny"
    with pytest.raises(InvalidArgumentError):
        await session.repl.execute("")
    assert not [r for r in worker.requests if r["op"] == "execute"]
    assert (await session.repl.execute("1", timeout=limit)).success


async def test_a_short_lifetime_ends_on_time_not_a_reaper_round_later(orch: Orchestrator) -> None:
    """The reaper's round is up to 30 s apart (a quarter of the idle timeout); a set_timeout of
    a second wakes it to measure its sleep again (E2B's timeouts are seconds)."""
    session = await orch.create_session()
    await orch.set_timeout(session.id, 1)
    with anyio.fail_after(STEP_TIMEOUT):
        while not session.closed:  # noqa: ASYNC110 (a session's end has no event to wait on)
            await anyio.sleep(0.05)
    with pytest.raises(SessionNotFoundError, match="set_timeout"):
        orch.find_session(session.id)


def test_the_reap_interval_is_no_later_than_the_nearest_lifetime_end_ahead() -> None:
    held = [_FakeHeld(idle_s=600, ends_at=None), _FakeHeld(idle_s=600, ends_at=102.0)]
    assert reap_interval(held, 600, now=100.0) == 2.0  # type: ignore[arg-type]
    assert reap_interval(held, 600, now=103.0) == MAX_REAP_INTERVAL  # type: ignore[arg-type]
    assert reap_interval(held, 600, now=101.9) == MIN_REAP_INTERVAL  # type: ignore[arg-type]


class _FakeHeld:
    """What reap_interval reads of a session."""

    def __init__(self, *, idle_s: float, ends_at: float | None) -> None:
        self.ends_at = ends_at
        self.policy = type("P", (), {"timeouts": type("T", (), {"idle_s": idle_s})()})()


async def test_a_worker_whose_engine_froze_as_it_started_is_the_engines_failure(
    fake: FakeBackend,
) -> None:
    """No ready frame in time, and the engine does not answer a ping either (frozen, or
    restarting): ``backend_unavailable``, which a client retries, not ``process_crashed``."""

    def frozen_engine_worker(process: FakeProcess) -> ProgramRun:
        process.write(f"sandhold-pid {process.pid}\n".encode())
        fake.reachable = False  # the engine froze before the worker said it was ready
        while (yield) is not None:
            pass
        return 0

    fake.program(PID_ANNOUNCER, frozen_engine_worker)
    with anyio.fail_after(STEP_TIMEOUT + READY_TIMEOUT):
        async with Orchestrator(settings(), backend=fake) as orch:
            with pytest.raises(BackendUnavailableError) as refused:
                await orch.create_session()
            assert refused.value.code == "backend_unavailable"
            fake.reachable = True
