"""Sessions ending on their own, against real containers: idle teardown that sees running work, and
the periodic reconcile that removes containers of this orchestrator nobody knows and ends sessions
whose container stopped."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import docker
import pytest

from orchestrator._api import Orchestrator
from orchestrator.backend.base import ContainerSpec
from orchestrator.errors import SessionNotFoundError
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# The reaper looks every half second; a verdict is given within a few of its rounds.
VERDICT_TIMEOUT = 20.0
IDLE_POLICY = 'extends = "default"\n[timeouts]\nidle_s = 1\nidle_counts_processes = {}\n'


def idle_policy(directory: Path, counts_processes: bool) -> str:
    """The name of a policy with a 1 s idle timeout (written before the orchestrator starts:
    it serves the policies it read then)."""
    name = "counting" if counts_processes else "blind"
    (directory / f"{name}.toml").write_text(
        f'name = "{name}"\n' + IDLE_POLICY.format(str(counts_processes).lower())
    )
    return name


@pytest.fixture
async def orch(worker_image: ImageBuildResult, tmp_path: Path) -> AsyncIterator[Orchestrator]:
    for counts_processes in (True, False):
        idle_policy(tmp_path, counts_processes)
    settings = config(worker_image.tag, policy_dirs=(tmp_path,), reap_interval=0.5)
    async with Orchestrator(settings) as orchestrator:
        yield orchestrator


async def wait_until_ended(orch: Orchestrator, session_id: str) -> str:
    """The reason the owner is given once the session has ended (watched through the listing:
    looking a session up counts as activity)."""
    with anyio.fail_after(VERDICT_TIMEOUT):
        while any(s["session_id"] == session_id for s in orch.list_sessions()):  # noqa: ASYNC110 (the reaper sends no event)
            await anyio.sleep(0.2)
    with pytest.raises(SessionNotFoundError) as ended:
        orch.find_session(session_id)
    return str(ended.value)


async def test_a_session_with_a_running_process_is_not_idle_until_the_process_ends(
    orch: Orchestrator, tmp_path: Path
) -> None:
    policy = idle_policy(tmp_path, counts_processes=True)
    working = await orch.create_session(policy=policy)
    resting = await orch.create_session(policy=policy)
    started = await working.processes.start("sleep 30")

    assert "idle for 1 s" in await wait_until_ended(orch, resting.id)
    await anyio.sleep(2)  # several idle timeouts later, the working one is still there
    assert working.id in {s["session_id"] for s in orch.list_sessions()}

    await working.processes.kill(started.process_id)
    assert "idle for 1 s" in await wait_until_ended(orch, working.id)


async def test_a_policy_can_say_processes_do_not_count(orch: Orchestrator, tmp_path: Path) -> None:
    policy = idle_policy(tmp_path, counts_processes=False)
    session = await orch.create_session(policy=policy)
    await session.processes.start("sleep 30")
    assert "idle for 1 s" in await wait_until_ended(orch, session.id)


async def test_the_reconcile_removes_unknown_containers_of_its_id_and_ends_stopped_sessions(
    orch: Orchestrator, worker_image: ImageBuildResult
) -> None:
    policy = load_policy("default")
    stranger = ContainerSpec(
        image=worker_image.tag,
        policy=policy,
        session_id=secrets.token_hex(16),
        tenant="local",
        orchestrator_id=orch.orchestrator_id,
        extra_labels={TEST_RUN_LABEL: RUN_ID},
    )
    other_id = ContainerSpec(
        image=worker_image.tag,
        policy=policy,
        session_id=secrets.token_hex(16),
        tenant="local",
        orchestrator_id=f"{orch.orchestrator_id}-other",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
    )
    orphan = await orch.backend.create_container(stranger)
    not_ours = await orch.backend.create_container(other_id)
    try:
        session = await orch.create_session()
        engine = docker.from_env(timeout=30)
        try:
            engine.api.kill(session.container_id)
        finally:
            engine.close()

        assert "its container stopped or disappeared" in await wait_until_ended(orch, session.id)
        with anyio.fail_after(VERDICT_TIMEOUT):
            listed = {TEST_RUN_LABEL: RUN_ID}
            while orphan in await orch.backend.list_containers(listed):  # noqa: ASYNC110 (polling the engine)
                await anyio.sleep(0.2)
        # A container of another orchestrator id is never touched.
        assert not_ours in await orch.backend.list_containers({TEST_RUN_LABEL: RUN_ID})
    finally:
        await orch.backend.remove_container(not_ours)
        await orch.backend.remove_container(orphan)


async def test_maximum_lifetime_ends_a_session_whatever_runs_in_it(
    orch: Orchestrator, tmp_path: Path
) -> None:
    (tmp_path / "short.toml").write_text(
        'name = "short"\nextends = "default"\n[timeouts]\nidle_s = 2\nmax_lifetime_s = 2\n'
    )
    await orch.reload()  # a policy written after the start is served from the next reload
    session = await orch.create_session(policy="short")
    await session.processes.start("sleep 30")
    assert "maximum lifetime (2 s) reached" in await wait_until_ended(orch, session.id)


async def test_a_port_the_repl_itself_listens_on_keeps_the_session_from_idling(
    orch: Orchestrator, tmp_path: Path
) -> None:
    (tmp_path / "serving.toml").write_text(
        'name = "serving"\nextends = "unrestricted-python"\n[timeouts]\nidle_s = 1\n'
    )
    await orch.reload()
    session = await orch.create_session(policy="serving")
    opened = await session.repl.execute(
        "import socket\nserver = socket.socket()\nserver.bind(('127.0.0.1', 0))\nserver.listen()",
        timeout=10,
    )
    assert opened.success, opened
    await anyio.sleep(3)  # three idle timeouts: still there, a server is listening
    assert session.id in {s["session_id"] for s in orch.list_sessions()}

    closed = await session.repl.execute("server.close()", timeout=10)
    assert closed.success, closed
    assert "idle for 1 s" in await wait_until_ended(orch, session.id)


async def assert_a_stopped_container_ends_the_call(orch: Orchestrator, policy: str) -> None:
    """A cell runs; its container is killed from outside: the call answers process_crashed
    within seconds (not at its two-minute timeout), saying why, and the session has ended."""
    session = await orch.create_session(policy=policy)
    started = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def kill_soon() -> None:
            await anyio.sleep(1.5)
            engine = docker.from_env(timeout=30)
            try:
                await anyio.to_thread.run_sync(engine.api.kill, session.container_id)
            finally:
                engine.close()

        tg.start_soon(kill_soon)
        with anyio.fail_after(60):
            outcome = await orch.execute(
                "import time\ntime.sleep(100)", session_id=session.id, timeout_s=120
            )
    assert time.monotonic() - started < 20
    assert outcome.error_type == "process_crashed" and outcome.state_reset, outcome
    # Stopped, or already gone: the periodic reconcile may have removed it first.
    assert "its container" in (outcome.error_message or ""), outcome
    with pytest.raises(SessionNotFoundError, match="its container stopped"):
        orch.find_session(session.id)


async def test_a_container_killed_under_a_cell_ends_the_call_and_the_session(
    orch: Orchestrator,
) -> None:
    await assert_a_stopped_container_ends_the_call(orch, "default")


def _engine_sockets() -> int:
    """This process's sockets: the Docker SDK's connections to the engine among them."""
    import os

    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return sum(kind.startswith("socket:") for kind in kinds)


async def test_an_orchestrator_closes_the_engine_connections_it_opened(
    worker_image: ImageBuildResult,
) -> None:
    """One made without a backend makes its own and closes it: started and stopped three
    times, the process holds no more sockets than before (each run left a dozen open before)."""
    before = _engine_sockets()
    for _ in range(3):
        async with Orchestrator(config(worker_image.tag)) as orch:
            made = await orch.call("python_repl", {"operation": "execute", "code": "1"})
            assert made.structured["success"]
    assert _engine_sockets() <= before
