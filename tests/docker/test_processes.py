"""Background processes (the ``process`` tool's engine) against real session containers."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import orchestrator.session.processes as processes_module
from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import (
    BackendError,
    InvalidArgumentError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.policy.commands import MAX_COMMAND_BYTES
from orchestrator.policy.model import Policy, load_policy
from orchestrator.session.processes import (
    LOG_CAP_PER_STREAM_BYTES,
    ProcessInfo,
    SessionProcesses,
)
from tests.conftest import ContainerFactory

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1024 * 1024
# Polling `list` is the only way to see a port open or a group end; each poll is one exec.
POLL_INTERVAL = 0.1
WAIT_TIMEOUT = 30.0
SERVER = "python3 -m http.server 8765 --bind 127.0.0.1"
FETCH = "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8765/').status)"
# Counts the processes of a process group, from inside the container.
GROUP_SIZE = """
import os, sys
pgid = int(sys.argv[1])
count = 0
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            count += os.getpgid(int(name)) == pgid
        except OSError:
            pass
print(count)
"""


async def run_python(backend: DockerBackend, container_id: str, source: str, *args: str) -> str:
    result = await backend.run(
        container_id,
        ExecSpec(argv=["python3", "-I", "-c", source, *args]),
        timeout=60,
        max_output_bytes=MIB,
    )
    assert result.exit_code == 0, result.stderr.decode()
    return result.stdout.decode().strip()


async def group_size(backend: DockerBackend, container_id: str, pgid: int) -> int:
    return int(await run_python(backend, container_id, GROUP_SIZE, str(pgid)))


async def wait_for(
    procs: SessionProcesses, process_id: str, condition: Callable[[ProcessInfo], bool]
) -> ProcessInfo:
    with anyio.fail_after(WAIT_TIMEOUT):
        while True:
            listed = {info.process_id: info for info in (await procs.list()).processes}
            if condition(listed[process_id]):
                return listed[process_id]
            await anyio.sleep(POLL_INTERVAL)


def _with_limits(policy: Policy, **limits: Any) -> Policy:
    return policy.model_copy(update={"limits": policy.limits.model_copy(update=limits)})


@pytest.fixture
async def session(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> tuple[SessionProcesses, str]:
    policy = load_policy("default")
    container_id = await make_container(policy)
    return SessionProcesses(docker_backend, container_id, policy), container_id


async def test_a_background_server_shows_its_port_answers_and_is_gone_after_kill(
    session: tuple[SessionProcesses, str], docker_backend: DockerBackend
) -> None:
    procs, container_id = session
    started = await procs.start(SERVER)
    assert len(started.process_id) == 32
    assert started.pgid == started.pid

    info = await wait_for(procs, started.process_id, lambda info: 8765 in info.ports)
    assert info.state == "running"
    assert info.exit_code is None
    assert info.command == SERVER
    assert await run_python(docker_backend, container_id, FETCH) == "200"

    killed = await procs.kill(started.process_id)
    assert killed.signal_used == "SIGTERM"
    assert killed.group_empty
    assert killed.state == "killed"
    [listed] = (await procs.list()).processes
    assert (listed.state, listed.ports) == ("killed", ())
    assert await group_size(docker_backend, container_id, started.pgid) == 0


async def test_a_process_that_exits_reports_its_exit_code(
    session: tuple[SessionProcesses, str],
) -> None:
    procs, _ = session
    started = await procs.start(
        "echo $GREETING from $PWD; exit 7", cwd="sub/..", env={"GREETING": "hi"}
    )
    info = await wait_for(procs, started.process_id, lambda info: info.state != "running")
    assert (info.state, info.exit_code) == ("exited", 7)
    output = await procs.read_output(started.process_id)
    assert output.output == "hi from /workspace"
    assert output.elapsed_s == info.elapsed_s  # the clock stops when the process ends


async def test_read_output_returns_the_last_lines(session: tuple[SessionProcesses, str]) -> None:
    procs, _ = session
    started = await procs.start("seq 1 500; echo oops >&2")
    await wait_for(procs, started.process_id, lambda info: info.state == "exited")
    output = await procs.read_output(started.process_id, tail=3)
    assert output.output.splitlines() == ["499", "500", "oops"]
    assert (output.lines, output.truncated, output.dropped_bytes) == (3, False, 0)


async def test_an_output_flood_keeps_the_log_within_its_cap(
    session: tuple[SessionProcesses, str], docker_backend: DockerBackend
) -> None:
    procs, container_id = session
    policy = load_policy("default")
    cap = LOG_CAP_PER_STREAM_BYTES * policy.output.max_stream_bytes
    started = await procs.start("yes 0123456789 | head -n 3000000; echo done")
    await wait_for(procs, started.process_id, lambda info: info.state == "exited")

    log = f"/tmp/.sandhold/procs/{started.process_id}.log"
    size = await run_python(
        docker_backend, container_id, f"import os;print(os.path.getsize({log!r}))"
    )
    assert int(size) <= cap
    output = await procs.read_output(started.process_id, tail=2)
    assert output.output.splitlines() == ["0123456789", "done"]
    assert output.dropped_bytes >= 33_000_000 - cap


async def test_killing_a_group_whose_shell_already_exited_leaves_nothing(
    session: tuple[SessionProcesses, str], docker_backend: DockerBackend
) -> None:
    procs, container_id = session
    started = await procs.start("sleep 1000 & sleep 1000 & exit 0")
    # The shell is gone at once; its two children keep the group, and the process, running.
    with anyio.fail_after(WAIT_TIMEOUT):
        while True:
            if await group_size(docker_backend, container_id, started.pgid) == 2:
                break
            await anyio.sleep(POLL_INTERVAL)
    [listed] = (await procs.list()).processes
    assert listed.state == "running"

    killed = await procs.kill(started.process_id)
    assert (killed.state, killed.signal_used, killed.group_empty) == ("killed", "SIGTERM", True)
    assert killed.exit_code == 0  # the shell's own status
    assert await group_size(docker_backend, container_id, started.pgid) == 0


async def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(
    session: tuple[SessionProcesses, str], docker_backend: DockerBackend
) -> None:
    procs, container_id = session
    started = await procs.start("trap '' TERM; sleep 1000; true")
    await wait_for(procs, started.process_id, lambda info: info.state == "running")
    killed = await procs.kill(started.process_id)
    assert (killed.state, killed.signal_used, killed.group_empty) == ("killed", "SIGKILL", True)
    assert killed.exit_code == -9
    assert await group_size(docker_backend, container_id, started.pgid) == 0


async def test_killing_an_ended_process_sends_nothing(
    session: tuple[SessionProcesses, str],
) -> None:
    procs, _ = session
    started = await procs.start("exit 3")
    await wait_for(procs, started.process_id, lambda info: info.state == "exited")
    killed = await procs.kill(started.process_id)
    assert (killed.state, killed.exit_code, killed.signal_used) == ("exited", 3, None)
    assert killed.group_empty


async def test_the_per_session_limit_gives_quota_exceeded(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = _with_limits(load_policy("default"), processes_per_session=2)
    procs = SessionProcesses(docker_backend, await make_container(policy), policy)
    await procs.start("exit 0")  # an ended process does not count
    first = await procs.start("sleep 1000")
    await procs.start("sleep 1000")

    with pytest.raises(QuotaExceededError) as caught:
        await procs.start("sleep 1000")
    assert caught.value.code == "quota_exceeded"
    assert "processes_per_session" in str(caught.value)
    assert len((await procs.list()).processes) == 3

    await procs.kill(first.process_id)
    await procs.start("sleep 1000")


async def test_concurrent_starts_cannot_pass_the_limit_together(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = _with_limits(load_policy("default"), processes_per_session=2)
    procs = SessionProcesses(docker_backend, await make_container(policy), policy)
    outcomes: list[str] = []

    async def start_one() -> None:
        try:
            await procs.start("sleep 1000")
            outcomes.append("started")
        except QuotaExceededError:
            outcomes.append("refused")

    with anyio.fail_after(WAIT_TIMEOUT):
        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(start_one)
    assert sorted(outcomes) == ["refused"] * 3 + ["started"] * 2


async def test_a_working_directory_that_links_out_of_the_workspace_is_refused(
    session: tuple[SessionProcesses, str], docker_backend: DockerBackend
) -> None:
    procs, container_id = session
    await run_python(docker_backend, container_id, "import os; os.symlink('/etc', 'out')")
    with pytest.raises(InvalidArgumentError):
        await procs.start("true", cwd="out")
    assert (await procs.list()).processes == ()


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("", {}),
        ("   ", {}),
        ("echo a\0b", {}),
        (123, {}),
        (None, {}),
        ("x" * (MAX_COMMAND_BYTES + 1), {}),
        ("é" * (MAX_COMMAND_BYTES // 2 + 1), {}),
        ("echo \ud800", {}),
        ("true", {"cwd": "/etc"}),
        ("true", {"cwd": "../outside"}),
        ("true", {"cwd": "does/not/exist"}),
        ("true", {"env": {"A": "a\0b"}}),
        ("true", {"env": {"A B": "x"}}),
        ("true", {"env": ["A=1"]}),
    ],
)
async def test_a_bad_start_is_refused_and_starts_nothing(
    session: tuple[SessionProcesses, str], command: Any, options: dict[str, Any]
) -> None:
    procs, _ = session
    with pytest.raises(InvalidArgumentError) as caught:
        await procs.start(command, **options)
    assert caught.value.code == "invalid_argument"
    assert (await procs.list()).processes == ()


@pytest.mark.parametrize("tail", [-1, 0, 10_001, "x", 2.5, True, None])
async def test_a_bad_tail_is_refused(session: tuple[SessionProcesses, str], tail: Any) -> None:
    procs, _ = session
    started = await procs.start("echo hi")
    with pytest.raises(InvalidArgumentError):
        await procs.read_output(started.process_id, tail=tail)


@pytest.mark.parametrize(
    "process_id", [secrets.token_hex(16), "nope", "../../etc/passwd", "A" * 32, "", "a" * 32 + "\n"]
)
async def test_an_unknown_process_id_is_not_found_the_same_way(
    session: tuple[SessionProcesses, str], process_id: str
) -> None:
    procs, _ = session
    messages = set()
    for operation in (procs.read_output, procs.kill):
        with pytest.raises(SessionNotFoundError) as caught:
            await operation(process_id)
        assert caught.value.code == "session_not_found"
        messages.add(str(caught.value))
    assert messages == {"no background process with this process_id in this session"}


async def test_a_process_id_that_is_not_a_string_is_invalid(
    session: tuple[SessionProcesses, str],
) -> None:
    procs, _ = session
    with pytest.raises(InvalidArgumentError):
        await procs.kill(12345)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "helper_output",
    [
        "print('not json')",
        "print('[' * 100000)",
        "print('x' * (5 * 1024 * 1024))",
        'print(\'{"ok": true, "processes": [{"process_id": 1}]}\')',
        'print(\'{"ok": true, "processes": [], "extra": 1}\')',
        'print(\'{"ok": "yes"}\')',
        'print(\'{"ok": false, "error_type": "internal", "error_message": "boom"}\')',
        "import os; os._exit(3)",
    ],
)
async def test_a_lying_helper_gives_a_backend_error(
    session: tuple[SessionProcesses, str], monkeypatch: pytest.MonkeyPatch, helper_output: str
) -> None:
    procs, _ = session
    monkeypatch.setattr(processes_module, "PROCS_ARGV", ("python3", "-I", "-c", helper_output))
    with pytest.raises(BackendError) as caught:
        await procs.list()
    assert caught.value.code == "internal"


async def test_a_helper_that_does_not_answer_is_an_internal_error(
    session: tuple[SessionProcesses, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    procs, _ = session
    # The operation's name comes last in the argv; here it is the silent shell's $1.
    monkeypatch.setattr(processes_module, "PROCS_ARGV", ("sh", "-c", "sleep 600", "sh"))
    monkeypatch.setattr(processes_module, "OP_TIMEOUT", 0.5)
    with anyio.fail_after(30), pytest.raises(BackendError) as caught:
        await procs.list()
    assert caught.value.code == "internal"
