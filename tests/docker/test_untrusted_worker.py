"""A worker that lies or babbles costs its own state and nothing else: fake workers (scripts that
speak a broken protocol) run in a real container, and the Repl must answer process_crashed, keep
the orchestrator's loop alive, and leave no stray process behind."""

from __future__ import annotations

import anyio
import pytest

from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import ProcessCrashedError
from orchestrator.policy.model import load_policy
from orchestrator.session.repl.interpreter import Repl
from orchestrator.session.repl.worker_process import WORKER_ARGV
from tests.conftest import ContainerFactory

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

READY = "{'type': 'ready', 'pid': os.getpid(), 'protocol': 1, 'python': 'fake'}"
# Each fake answers the first request (after the ready line) in its own broken way.
FAKES = {
    "garbage": "print('this is not json', flush=True)",
    "second_reply": (
        "r = {'type': 'reply', 'id': req['id'], 'ok': True, 'success': True,"
        " 'execution_time_ms': 0, 'cpu_time_ms': 0, 'peak_memory_mb': 0}\n"
        "print(json.dumps(r), flush=True)\nprint(json.dumps(r), flush=True)"
    ),
    "wrong_id": (
        "print(json.dumps({'type': 'reply', 'id': 'someone-else', 'ok': True}), flush=True)"
    ),
    "huge_line": "sys.stdout.write('x' * (64 * 1024 * 1024)); sys.stdout.flush()",
    "bad_schema": (
        "print(json.dumps({'type': 'reply', 'id': req['id'], 'ok': True,"
        " 'success': 'yes', 'execution_time_ms': -1}), flush=True)"
    ),
    "ready_again": f"print(json.dumps({READY}), flush=True)",
    # Numbers past any bound: Python refuses to convert a 5000-digit integer (a ValueError of its
    # own), JSON has no Infinity, and 1e999 parses as one.
    "huge_integer": (
        'print(\'{"type": "reply", "id": "%s", "ok": true, "success": true,'
        ' "execution_time_ms": %s, "cpu_time_ms": 0, "peak_memory_mb": 0}\''
        " % (req['id'], '9' * 5000), flush=True)"
    ),
    "infinity": (
        "r = {'type': 'reply', 'id': req['id'], 'ok': True, 'success': True,"
        " 'execution_time_ms': 0, 'cpu_time_ms': float('inf'), 'peak_memory_mb': 0}\n"
        "print(json.dumps(r), flush=True)"
    ),
    "overflowing_float": (
        "r = {'type': 'reply', 'id': req['id'], 'ok': True, 'success': True,"
        " 'execution_time_ms': 0, 'cpu_time_ms': 0, 'peak_memory_mb': 0}\n"
        "print(json.dumps(r).replace('\"peak_memory_mb\": 0', '\"peak_memory_mb\": 1e999'),"
        " flush=True)"
    ),
    "unbounded_count": (
        "r = {'type': 'reply', 'id': req['id'], 'ok': True, 'success': True,"
        " 'stdout_bytes': 10 ** 30, 'execution_time_ms': 0, 'cpu_time_ms': 0,"
        " 'peak_memory_mb': 0}\n"
        "print(json.dumps(r), flush=True)"
    ),
    "posing_as_the_host": (
        "r = {'type': 'reply', 'id': req['id'], 'ok': True, 'success': False,"
        " 'error_type': 'timeout', 'execution_time_ms': 0, 'cpu_time_ms': 0,"
        " 'peak_memory_mb': 0}\n"
        "print(json.dumps(r), flush=True)"
    ),
}


FAKE_MARKER = "sandhold-fake-worker"


def processes_matching(marker: str) -> list[str]:
    """argv of a probe counting the container's processes whose command line holds ``marker``."""
    script = (
        "import os\n"
        "n = 0\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    if int(pid) == os.getpid():\n"
        "        continue\n"
        "    try:\n"
        "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        f"    n += {marker!r}.encode() in cmd\n"
        "print(n)"
    )
    return ["python3", "-c", script]


def fake_worker(behaviour: str) -> list[str]:
    script = (
        f"# {FAKE_MARKER}\n"
        "import json, os, sys, time\n"
        f"print(json.dumps({READY}), flush=True)\n"
        "req = json.loads(sys.stdin.readline())\n"
        f"{FAKES[behaviour]}\n"
        "time.sleep(60)\n"
    )
    return ["python3", "-c", script]


async def test_a_worker_that_lies_about_its_pid_never_starts_and_is_killed(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy("default")
    container_id = await make_container(policy)
    lying = (
        f"# {FAKE_MARKER}\n"
        "import json, time\n"
        "ready = {'type': 'ready', 'pid': 2, 'protocol': 1, 'python': 'x'}\n"
        "print(json.dumps(ready), flush=True)\n"
        "time.sleep(60)"
    )
    repl = Repl(docker_backend, container_id, policy, worker_argv=["python3", "-c", lying])
    with pytest.raises(ProcessCrashedError, match="failed to start"):
        await repl.start()
    leftover = await docker_backend.run(
        container_id,
        ExecSpec(argv=processes_matching(FAKE_MARKER)),
        timeout=10,
        max_output_bytes=100,
    )
    assert leftover.stdout.decode().strip() == "0"


@pytest.mark.parametrize("behaviour", sorted(FAKES))
async def test_a_lying_worker_is_ended_and_reported_as_crashed(
    behaviour: str, docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy("default")
    container_id = await make_container(policy)
    repl = Repl(docker_backend, container_id, policy, worker_argv=fake_worker(behaviour))
    try:
        await repl.start()
        with anyio.fail_after(20):
            first = await repl.execute("1", timeout=5)
            if behaviour == "second_reply":
                # The first reply is fine; the extra one is found at the next request.
                assert first.success
                first = await repl.execute("1", timeout=5)
        assert first.error_type == "process_crashed", first
        assert first.state_reset
    finally:
        await repl.aclose()
    leftover = await docker_backend.run(
        container_id,
        ExecSpec(argv=processes_matching(FAKE_MARKER)),
        timeout=10,
        max_output_bytes=100,
    )
    assert leftover.stdout.decode().strip() == "0"  # the lying worker was killed


async def test_after_timeouts_and_crashes_exactly_one_worker_runs(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy("unrestricted-python")
    container_id = await make_container(policy)
    repl = Repl(docker_backend, container_id, policy)
    try:
        await repl.start()
        await repl.execute("sum(range(10**12))", timeout=0.5)  # killed and replaced
        await repl.execute("import os; os._exit(1)", timeout=5)  # crashed
        await repl.execute("while True: pass", timeout=0.5)  # interrupted, kept
        assert (await repl.execute("1 + 1", timeout=5)).result_repr == "2"
    finally:
        await repl.aclose()
    result = await docker_backend.run(
        container_id,
        ExecSpec(argv=processes_matching(WORKER_ARGV[-1])),
        timeout=10,
        max_output_bytes=100,
    )
    assert result.stdout.decode().strip() == "0"  # aclose killed the last one too
