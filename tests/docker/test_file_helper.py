"""The session's served file helper (``fileops.py --serve``) in real containers: one exec answers
many operations, and whatever becomes of it (killed from inside, idle, cancelled mid-reply, fed
garbage or forged lines through its stdout by code running as the same user, closed with its
session) costs that exec only: the next operation gets a right answer. Results and refusals of
each operation are tested in test_files.py, which runs through this helper too."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

import orchestrator.session.files.operations as files_module
from orchestrator._api import Orchestrator
from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import BackendError
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from orchestrator.session.files.operations import SessionFiles
from tests.conftest import ContainerFactory
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1024 * 1024
# How long a helper may take to exit once it has been told to (EOF, idle) or killed.
EXIT_TIMEOUT = 30.0
# The command line of a served helper, as /proc shows it (NUL-separated).
SERVED = b"fileops.py\0--serve\0"
# A probe run as the sandbox user, like code in the session: the served helpers' pids, and with
# ACTION set, something done to each of them (kill it, write into its stdout).
PROBE = """
import os, sys
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    if MARKER in cmd:
        found.append(int(pid))
for pid in found:
    ACTION
print(" ".join(map(str, sorted(found))))
"""

Probe = Callable[..., Awaitable[list[int]]]


@pytest.fixture
async def container(make_container: ContainerFactory) -> str:
    return await make_container(load_policy("default"))


@pytest.fixture
async def files(docker_backend: DockerBackend, container: str) -> AsyncIterator[SessionFiles]:
    session_files = SessionFiles(docker_backend, container, load_policy("default"))
    try:
        yield session_files
    finally:
        await session_files.aclose()


@pytest.fixture
def helpers(docker_backend: DockerBackend, container: str) -> Probe:
    """The pids of the container's served file helpers, after ``action`` (Python, with ``pid``
    bound) was done to each."""

    async def probe(action: str = "pass") -> list[int]:
        code = PROBE.replace("MARKER", repr(SERVED)).replace("ACTION", action)
        result = await docker_backend.run(
            container,
            ExecSpec(argv=["python3", "-I", "-c", code]),
            timeout=30,
            max_output_bytes=MIB,
        )
        assert result.exit_code == 0, result.stderr.decode()
        return [int(pid) for pid in result.stdout.split()]

    return probe


def write_into_stdout(data: bytes) -> str:
    """An action that writes ``data`` into a helper's stdout, as code in the sandbox can."""
    return f"fd = os.open(f'/proc/{{pid}}/fd/1', os.O_WRONLY); os.write(fd, {data!r}); os.close(fd)"


async def until_no_helper(helpers: Probe) -> None:
    with anyio.fail_after(EXIT_TIMEOUT):
        while True:
            if not await helpers():
                return
            await anyio.sleep(0.05)


async def test_one_helper_answers_every_small_operation_of_a_session(
    files: SessionFiles, helpers: Probe
) -> None:
    await files.write("a.txt", content="one")
    first = await helpers()
    await files.write("b.txt", content="two")
    assert (await files.read("a.txt")).content == "one"
    assert [entry.name for entry in (await files.list(".")).entries] == ["a.txt", "b.txt"]
    assert (await files.stat("b.txt")).size == 3
    assert (await files.check("b.txt")).exists
    assert len(first) == 1 and await helpers() == first


async def test_operations_keep_working_after_code_in_the_sandbox_kills_the_helper(
    files: SessionFiles, helpers: Probe
) -> None:
    await files.write("a.txt", content="before")
    killed = await helpers("os.kill(pid, 9)")
    assert len(killed) == 1
    assert (await files.read("a.txt")).content == "before"
    await files.write("a.txt", content="after")
    assert (await files.read("a.txt")).content == "after"
    again = await helpers()
    assert len(again) == 1 and again != killed


async def test_a_read_cancelled_mid_reply_leaves_the_next_operations_right(
    files: SessionFiles,
) -> None:
    big = os.urandom(8 * MIB)
    await files.write("big.bin", content_b64=base64.b64encode(big).decode())
    await files.write("small.txt", content="small")
    with anyio.move_on_after(0.005) as scope:
        await files.read("big.bin")
    assert scope.cancelled_caught
    assert (await files.read("small.txt")).content == "small"
    again = await files.read("big.bin")
    assert again.content_b64 is not None and base64.b64decode(again.content_b64) == big


async def test_a_write_cancelled_on_its_way_leaves_the_old_file_or_the_new_one_whole(
    files: SessionFiles,
) -> None:
    await files.write("f.bin", content="old")
    new = os.urandom(8 * MIB)
    with anyio.move_on_after(0.005) as scope:
        await files.write("f.bin", content_b64=base64.b64encode(new).decode())
    assert scope.cancelled_caught
    seen = await files.read("f.bin")
    assert seen.content == "old" or base64.b64decode(seen.content_b64 or "") == new
    await files.write("f.bin", content="next")
    assert (await files.read("f.bin")).content == "next"


async def test_garbage_in_the_helpers_stdout_is_an_internal_error_and_the_next_call_recovers(
    files: SessionFiles, helpers: Probe
) -> None:
    await files.write("a.txt", content="mine")
    assert len(await helpers(write_into_stdout(b"this is not json\n"))) == 1
    with pytest.raises(BackendError) as caught:
        await files.read("a.txt")
    assert caught.value.code == "internal"
    assert (await files.read("a.txt")).content == "mine"


async def test_a_forged_reply_under_another_id_is_ignored(
    files: SessionFiles, helpers: Probe
) -> None:
    await files.write("a.txt", content="mine")
    forged = b'{"id": "0123456789abcdef", "ok": true, "size": 6, "content_b64": "Zm9yZ2Vk"}\n'
    assert len(await helpers(write_into_stdout(forged))) == 1
    assert (await files.read("a.txt")).content == "mine"


async def test_a_reply_line_over_the_bound_is_an_internal_error_and_the_next_call_recovers(
    files: SessionFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    await files.write("a.txt", content="mine")
    await files.aclose()  # the next SessionFiles starts the babbling helper below
    babbling = ("sh", "-c", "head -c 40000000 /dev/zero", "sh")
    monkeypatch.setattr(files_module, "FILEOPS_ARGV", babbling)
    fresh = SessionFiles(files._backend, files._container_id, load_policy("default"))
    try:
        with anyio.fail_after(30), pytest.raises(BackendError) as caught:
            await fresh.read("a.txt")
        assert caught.value.code == "internal"
        monkeypatch.undo()
        assert (await fresh.read("a.txt")).content == "mine"
    finally:
        await fresh.aclose()


async def test_a_large_transfer_leaves_the_helper_no_larger_than_it_was(
    files: SessionFiles, docker_backend: DockerBackend, container: str
) -> None:
    """The helper lives on between requests: what one large file cost it must go back."""
    await files.write("small.txt", content="x")
    await files.read("small.txt")
    before = await anonymous_kib(docker_backend, container)
    big = base64.b64encode(os.urandom(8 * MIB)).decode()
    for _ in range(2):
        await files.write("big.bin", content_b64=big)
        await files.read("big.bin")
    # Answered only once the helper let go of the large reply (its last bytes can reach us
    # before it does).
    await files.read("small.txt")
    assert await anonymous_kib(docker_backend, container) < before + 2048


async def anonymous_kib(backend: DockerBackend, container: str) -> int:
    """The served helper's anonymous memory (RssAnon), in KiB, as its /proc status says."""
    action = "print([x.split()[1] for x in open(f'/proc/{pid}/status') if x[:8] == 'RssAnon:'][0])"
    code = PROBE.replace("MARKER", repr(SERVED)).replace("ACTION", action)
    argv = ["python3", "-I", "-c", code]
    result = await backend.run(container, ExecSpec(argv=argv), timeout=30, max_output_bytes=MIB)
    figure, _pids = result.stdout.decode().splitlines()
    return int(figure)


async def test_the_helper_exits_when_its_stream_is_closed(
    files: SessionFiles, helpers: Probe
) -> None:
    await files.write("a.txt", content="x")
    assert len(await helpers()) == 1
    await files.aclose()
    await until_no_helper(helpers)


async def test_an_idle_helper_exits_by_itself_and_the_next_call_starts_another(
    files: SessionFiles, helpers: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files_module, "SERVED_IDLE_TIMEOUT", 0.2)
    await files.write("a.txt", content="x")
    await until_no_helper(helpers)
    assert (await files.read("a.txt")).content == "x"


async def test_a_served_helper_neither_holds_the_host_lease_nor_keeps_an_orphan_alive(
    make_container: ContainerFactory, docker_backend: DockerBackend
) -> None:
    """No REPL worker holds the lease here, as after its orchestrator died: the watchdog must end
    the container after the grace while the file helper still runs, its stream open."""
    policy = load_policy("default")
    timeouts = policy.timeouts.model_copy(update={"orphan_grace_s": 2.0})
    container = await make_container(policy.model_copy(update={"timeouts": timeouts}))
    files = SessionFiles(docker_backend, container, policy)
    try:
        await files.write("a.txt", content="x")
        assert files._served.running
        with anyio.fail_after(EXIT_TIMEOUT):
            while True:
                if not (await docker_backend.container_state(container)).running:
                    break
                await anyio.sleep(0.2)
    finally:
        await files.aclose()


async def test_concurrent_operations_on_one_session_each_get_their_own_answer(
    files: SessionFiles,
) -> None:
    names = [f"f{n}.txt" for n in range(8)]
    for name in names:
        await files.write(name, content=name)
    seen: dict[str, str | None] = {}

    async def read(name: str) -> None:
        seen[name] = (await files.read(name)).content

    async with anyio.create_task_group() as group:
        for name in names:
            group.start_soon(read, name)
    assert seen == {name: name for name in names}


async def test_a_file_written_through_the_helper_is_the_sandbox_users(
    files: SessionFiles, docker_backend: DockerBackend, container: str
) -> None:
    await files.write("owned.txt", content="x")
    argv = ["stat", "-c", "%u %a", "/workspace/owned.txt"]
    result = await docker_backend.run(
        container, ExecSpec(argv=argv), timeout=30, max_output_bytes=MIB
    )
    assert result.stdout.decode().split() == ["10001", "644"]


async def test_the_served_helper_answers_each_line_by_its_id_and_ends_at_eof(
    docker_backend: DockerBackend, container: str
) -> None:
    argv = [*files_module.FILEOPS_ARGV, "--serve", "1000", "60"]
    stream = await docker_backend.open_exec(container, ExecSpec(argv=argv))
    try:
        lines = [
            b"not json",
            b"x" * 2000,  # over its bound: dropped whole, not read as two requests
            json.dumps({"op": "stat", "path": "/workspace"}).encode(),  # no id
            json.dumps({"id": "a", "op": "stat", "path": "/workspace"}).encode(),
            json.dumps({"id": "b", "op": "nope"}).encode(),
            json.dumps({"id": "c", "op": "read", "path": "/etc/passwd", "max_bytes": 9}).encode(),
        ]
        await stream.send(b"".join(line + b"\n" for line in lines))
        await stream.send_eof()
        out = b""
        with anyio.fail_after(30):
            while (chunk := await stream.receive()) is not None:
                out += chunk[1] if chunk[0] == 1 else b""
        code = await docker_backend.wait_exec_exit(stream.exec_id, timeout=10)
    finally:
        await stream.aclose()
    replies = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["ok"]) for r in replies] == [
        (None, False),
        (None, False),
        (None, False),
        ("a", True),
        ("b", False),
        ("c", False),
    ]
    assert {r.get("error_type") for r in replies if not r["ok"]} == {"invalid_argument"}
    assert replies[3]["type"] == "dir"
    assert code == 0


# Through the orchestrator


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def ok(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    result = await orch.call(tool, args)
    assert result.structured["success"], result.structured
    return result.structured


KILL_HELPERS = f"""
import os, signal
killed = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmd = open(f"/proc/{{pid}}/cmdline", "rb").read()
    except OSError:
        continue
    if {SERVED!r} in cmd:
        os.kill(int(pid), signal.SIGKILL)
        killed += 1
killed
"""


async def test_files_keep_working_after_user_code_kills_the_helper(orch: Orchestrator) -> None:
    started = await ok(
        orch, "python_repl", operation="execute", code="1", policy="unrestricted-python"
    )
    sid = started["session_id"]
    await ok(orch, "files", operation="write", session_id=sid, path="a.txt", content="kept")
    killed = await ok(orch, "python_repl", operation="execute", session_id=sid, code=KILL_HELPERS)
    assert killed["result_repr"] == "1"
    read = await ok(orch, "files", operation="read", session_id=sid, path="a.txt")
    assert read["content"] == "kept"


async def test_destroying_a_session_closes_its_file_helper_stream(orch: Orchestrator) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="1"))["session_id"]
    await ok(orch, "files", operation="write", session_id=sid, path="a.txt", content="x")
    served = orch.find_session(sid).files._served
    current = served._current
    assert current is not None
    await ok(orch, "python_repl", operation="destroy", session_id=sid)
    assert not served.running
    with pytest.raises(anyio.ClosedResourceError):  # closed by us, not merely broken
        await current.stream.send(b"{}\n")
