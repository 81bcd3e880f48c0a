"""The REPL worker outlives the stream of the orchestrator that started it: when that stream ends
without a kill (the orchestrator died), a new Repl re-adopts the worker through a relay and finds
its state; a worker that cannot be re-adopted is killed, never left as an orphan."""

from __future__ import annotations

import pytest

from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.policy.model import load_policy
from orchestrator.session.repl.interpreter import Repl
from orchestrator.session.repl.worker_process import WORKER_ARGV, kill_pid
from tests.conftest import ContainerFactory
from tests.docker.test_untrusted_worker import processes_matching

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


async def workers_running(backend: DockerBackend, container_id: str) -> int:
    argv = processes_matching(WORKER_ARGV[-1])
    result = await backend.run(container_id, ExecSpec(argv=argv), timeout=10, max_output_bytes=100)
    return int(result.stdout.decode().strip())


async def abandon(repl: Repl) -> int:
    """What a ``kill -9`` of the orchestrator does to a Repl: its stream closes, nobody kills the
    worker. Returns the worker's pid, as the registry would have it."""
    worker = repl._worker
    assert worker is not None
    await worker._stream.aclose()
    return worker.pid


async def test_a_new_repl_re_adopts_the_worker_and_its_state(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy("default")
    container_id = await make_container(policy)
    first = Repl(docker_backend, container_id, policy)
    await first.start()
    assert (await first.execute("x = 41", timeout=10)).success
    pid = await abandon(first)

    second = Repl(docker_backend, container_id, policy, adopt_pid=pid)
    try:
        outcome = await second.execute("x + 1", timeout=10)
        assert outcome.success and outcome.result_repr == "42"
        assert not outcome.state_reset
        assert second.worker_pid == pid
        # Adopted twice over: the relay's end also leaves the worker waiting for the next one.
        await abandon(second)
        third = Repl(docker_backend, container_id, policy, adopt_pid=pid)
        assert (await third.execute("x", timeout=10)).result_repr == "41"
        await third.aclose()
    finally:
        await second.aclose()
    assert await workers_running(docker_backend, container_id) == 0


async def test_a_worker_that_cannot_be_reached_is_replaced_and_says_so(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy("default")
    container_id = await make_container(policy)
    first = Repl(docker_backend, container_id, policy)
    await first.start()
    await first.execute("x = 1", timeout=10)
    pid = await abandon(first)
    await kill_pid(docker_backend, container_id, pid)

    new_pids: list[int] = []
    second = Repl(
        docker_backend, container_id, policy, adopt_pid=pid, on_new_worker=new_pids.append
    )
    try:
        probe = "try:\n    y = x\nexcept NameError:\n    y = 'gone'\ny"
        outcome = await second.execute(probe, timeout=10)
        assert outcome.success and outcome.result_repr == "'gone'"
        assert outcome.state_reset  # the caller learns its variables are gone
        assert new_pids == [second.worker_pid] and new_pids[0] != pid
        assert await workers_running(docker_backend, container_id) == 1
    finally:
        await second.aclose()


async def test_a_stranger_on_the_workers_socket_is_not_adopted(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    """User code can replace the socket file with its own listener; the relay names the real
    peer (SO_PEERCRED), which is not the registry's worker, so a fresh worker takes over."""
    policy = load_policy("unrestricted-python")
    container_id = await make_container(policy)
    first = Repl(docker_backend, container_id, policy)
    await first.start()
    squat = (
        "import os, socket, json, subprocess, sys\n"
        "path = f'/tmp/.sandhold/repl.{os.getpid()}.sock'\n"
        "code = ('import socket, os, json, time\\n'\n"
        "        f'p = {path!r}\\n'\n"
        "        'os.unlink(p); s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(1)\\n'\n"
        "        'c, _ = s.accept()\\n'\n"
        '        \'c.sendall(json.dumps({"type": "ready", "pid": %d, "protocol": 1,\'\n'
        '        \' "python": "fake"}).encode() + b"\\\\n")\\n\'\n'
        "        'time.sleep(30)\\n' % os.getpid())\n"
        "subprocess.Popen([sys.executable, '-c', code], start_new_session=True)\n"
        "import time; time.sleep(0.5)\n"
    )
    assert (await first.execute(squat, timeout=10)).success
    pid = await abandon(first)

    second = Repl(docker_backend, container_id, policy, adopt_pid=pid)
    try:
        outcome = await second.execute("1 + 1", timeout=10)
        assert outcome.result_repr == "2" and outcome.state_reset
        assert second.worker_pid != pid
    finally:
        await second.aclose()


async def test_a_worker_busy_with_an_abandoned_cell_is_interrupted_and_re_adopted(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    """The orchestrator died while a long cell ran (its answer, a large one, has no reader):
    the next orchestrator interrupts that cell and gets the worker back, variables intact."""
    policy = load_policy("default")
    container_id = await make_container(policy)
    first = Repl(docker_backend, container_id, policy)
    await first.start()
    assert (await first.execute("x = 41", timeout=10)).success
    worker = first._worker
    assert worker is not None
    await worker.send("execute", code="import time\nprint('y' * 200_000)\ntime.sleep(60)")
    pid = await abandon(first)

    second = Repl(docker_backend, container_id, policy, adopt_pid=pid)
    try:
        outcome = await second.execute("x + 1", timeout=10)
        assert outcome.result_repr == "42" and not outcome.state_reset, outcome
        assert second.worker_pid == pid
    finally:
        await second.aclose()
