"""``AsyncSandbox`` behaves the same in-process and remote: each test runs once over an
``Orchestrator`` in this process and once over a ``sandhold serve`` (the REST app on a loopback
socket) with tenant API keys. State is kept between cells, rich results come typed, output
streams before the cell ends, a user exception is data while a refused call raises its typed
error with its ``error_type``, files round trip, commands answer exit codes and background
handles, a tenant sees only its own sandboxes, and ``keep`` leaves a session."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from orchestrator import (
    AsyncSandbox,
    BackendUnavailableError,
    InvalidArgumentError,
    Orchestrator,
    OrchestratorError,
    PathNotFoundError,
    PolicyViolationError,
    SessionNotFoundError,
)
from orchestrator._core.tenants import new_key
from orchestrator.images import ImageBuildResult
from tests.docker.test_http_api import KEY_A, KEY_B
from tests.docker.test_python_repl import config
from tests.docker.test_rich_results import CLASSES, png_size
from tests.docker.test_streaming import CELL, EXPECTED_STDOUT, Arrivals, rest_server

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# One scenario of a few calls, each a cell or a command of well under a second.
SCENARIO_TIMEOUT = 120
POLICY = "unrestricted-python"
# The tenants the keys of tests.docker.test_http_api name; in-process, named as tenants.
TENANTS = {KEY_A: "tenant-a", KEY_B: "tenant-b"}


@dataclass
class Sandhold:
    """Where sandboxes are made: ``options(key)`` are the arguments that reach it as a tenant."""

    orchestrator: Orchestrator
    url: str | None

    def options(self, key: str = KEY_A) -> dict[str, Any]:
        if self.url is None:
            return {"orchestrator": self.orchestrator, "tenant": TENANTS[key]}
        return {"url": self.url, "api_key": key}


@pytest.fixture(params=["local", "remote"])
async def sandhold(
    request: pytest.FixtureRequest, worker_image: ImageBuildResult
) -> AsyncIterator[Sandhold]:
    async with Orchestrator(config(worker_image.tag)) as orch:
        if request.param == "local":
            yield Sandhold(orch, None)
            return
        async with rest_server(orch) as url:
            yield Sandhold(orch, url)


async def test_state_is_kept_and_rich_results_come_typed(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            assert (await sandbox.run_code("x = 41")).error is None
            answer = await sandbox.run_code("x + 1")
            assert answer.text == "42" and answer.results[0].is_main_result
            await sandbox.run_code(CLASSES)
            chart = (await sandbox.run_code("Chart()")).results[0]
            assert chart.png is not None and png_size(chart.png) == (32, 20)
            table = (await sandbox.run_code("Table()")).results[0]
            assert table.html is not None and "<table>" in table.html and table.png is None
            assert (await sandbox.inspect("x")).repr == "41"
            assert "x" in [v.name for v in await sandbox.variables()]
            assert [h.code for h in await sandbox.history()][:2] == ["x = 41", "x + 1"]


async def test_output_streams_to_the_callbacks_before_the_cell_ends(sandhold: Sandhold) -> None:
    arrivals = Arrivals()
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            execution = await sandbox.run_code(
                CELL,
                on_stdout=lambda text: arrivals.add("stdout", text),
                on_stderr=lambda text: arrivals.add("stderr", text),
            )
            ended = time.monotonic()
    arrivals.check_came_before(ended)
    assert execution.stdout == EXPECTED_STDOUT == arrivals.text("stdout")
    assert execution.stderr == "oops\n" == arrivals.text("stderr")


async def test_a_user_exception_is_data_and_a_refused_call_raises(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(**sandhold.options()) as sandbox:  # the default policy
            failed = await sandbox.run_code("def f():\n    return 1 / 0\nf()")
            assert failed.error is not None and failed.error.name == "ZeroDivisionError"
            assert "division by zero" in failed.error.value
            assert failed.error.traceback is not None and "in f" in failed.error.traceback
            blocked = await sandbox.run_code("import os")
            assert blocked.error is not None and blocked.error.name == "import_blocked"
            with pytest.raises(PolicyViolationError) as refused:
                await sandbox.commands.run("sudo true")
            assert refused.value.error_type == "policy"
            with pytest.raises(InvalidArgumentError) as missing:
                await sandbox.inspect("nothing_here")
            assert missing.value.error_type == "invalid_argument"
        with pytest.raises(SessionNotFoundError) as gone:
            await AsyncSandbox.connect(sandbox.sandbox_id, **sandhold.options())
        assert gone.value.error_type == "session_not_found"


async def test_files_round_trip_text_and_bytes(sandhold: Sandhold) -> None:
    data = bytes(range(256))
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            assert await sandbox.files.write("notes/a.txt", "héllo\n") == len("héllo\n".encode())
            await sandbox.files.write("blob.bin", data)
            assert await sandbox.files.read("notes/a.txt") == "héllo\n"
            assert await sandbox.files.read("notes/a.txt", format="bytes") == "héllo\n".encode()
            assert await sandbox.files.read("blob.bin") == data
            names = {entry.name: entry for entry in await sandbox.files.list()}
            assert names["notes"].type == "dir" and names["blob.bin"].size == 256
            assert await sandbox.files.exists("notes/a.txt")
            assert not await sandbox.files.exists("notes/b.txt")
            assert not await sandbox.files.exists("nowhere/b.txt")
            seen = await sandbox.run_code(
                "open('/workspace/blob.bin', 'rb').read() == bytes(range(256))"
            )
            assert seen.text == "True"


async def test_files_are_removed_moved_and_made_through_the_files_tool(
    sandhold: Sandhold,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            files = sandbox.files
            assert await files.make_dir("a/b") and not await files.make_dir("a/b")
            await files.write("a/b/one.txt", "1")
            await files.write("two.txt", "2")
            assert await files.rename("a/b/one.txt", "one.txt") == "/workspace/one.txt"
            with pytest.raises(InvalidArgumentError) as taken:
                await files.rename("one.txt", "two.txt")
            assert taken.value.error_type == "invalid_argument"
            await files.rename("one.txt", "two.txt", overwrite=True)
            assert await files.read("two.txt") == "1" and not await files.exists("one.txt")
            await files.write("a/b/three.txt", "3")
            with pytest.raises(InvalidArgumentError):
                await files.remove("a")  # not empty
            await files.remove("a", recursive=True)
            await files.remove("two.txt")
            assert [entry.name for entry in await files.list()] == []
            with pytest.raises(PathNotFoundError) as missing:
                await files.remove("two.txt")
            assert missing.value.error_type == "path_not_found"
            for outside in ("/etc/passwd", "../etc"):
                with pytest.raises(InvalidArgumentError):
                    await files.exists(outside)
            # A final symlink is an entry, wherever it points; the listing of old did not say.
            await sandbox.commands.run("ln -s /nowhere dangling")
            assert await files.exists("dangling")
            assert await files.exists(".")


async def test_the_lifetime_metrics_and_metadata_of_a_sandbox(sandhold: Sandhold) -> None:
    labels = {"purpose": "test", "run": "42"}
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(
            policy=POLICY, metadata=labels, **sandhold.options()
        ) as sandbox:
            assert sandbox.metadata == labels
            listed = {i.sandbox_id: i for i in await AsyncSandbox.list(**sandhold.options())}
            assert listed[sandbox.sandbox_id].metadata == labels
            async with AsyncSandbox.connect(sandbox.sandbox_id, **sandhold.options()) as again:
                assert again.metadata == labels

            ends = await sandbox.set_timeout(120)
            assert 100 < (ends - datetime.now(UTC)).total_seconds() <= 120
            with pytest.raises(PolicyViolationError) as beyond:
                await sandbox.set_timeout(30 * 86400)
            assert beyond.value.error_type == "policy"

            figures = await sandbox.metrics()
            assert figures.cpu_percent is None and figures.pids >= 1
            assert 0 < figures.memory_bytes < figures.memory_limit_bytes
            assert (await sandbox.metrics()).cpu_seconds >= figures.cpu_seconds
        with pytest.raises(InvalidArgumentError):
            await AsyncSandbox.create(metadata={"k": "v" * 2000}, **sandhold.options())


async def test_commands_answer_exit_codes_and_background_handles(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            ran = await sandbox.commands.run("echo hi; echo err >&2; bash -c 'exit 3'")
            assert ran.exit_code == 3 and ran.stdout == "hi\nerr\n" and not ran.timed_out
            await sandbox.commands.run("mkdir -p sub && export GREETING=hey")
            assert (await sandbox.commands.run("echo $GREETING")).stdout == "hey\n"
            here = await sandbox.commands.run("pwd; echo $WHO", cwd="sub", env={"WHO": "me"})
            assert here.stdout == "/workspace/sub\nme\n" and here.exit_code == 0
            slow = await sandbox.commands.run("sleep 30", timeout=1)
            assert slow.timed_out
            echo = await sandbox.commands.run("read line; echo got $line", background=True)
            await echo.send_stdin("x\n")
            done = await echo.wait(timeout=30)
            assert done.exit_code == 0 and done.stdout == "got x\n"
            sleeper = await sandbox.commands.run("sleep 600", background=True)
            assert (await sandbox.terminals.read(sleeper.terminal_id))["state"] == "running"
            await sandbox.commands.run("true")  # the handle's command is another process
            await sleeper.kill()
            killed = await sleeper.wait(timeout=30)
            assert not killed.timed_out and killed.exit_code != 0


async def test_a_tenant_sees_only_its_own_sandboxes(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options(KEY_A)) as mine:
            theirs = await AsyncSandbox.list(**sandhold.options(KEY_B))
            assert mine.sandbox_id not in [info.sandbox_id for info in theirs]
            ours = await AsyncSandbox.list(**sandhold.options(KEY_A))
            assert mine.sandbox_id in [info.sandbox_id for info in ours]
            with pytest.raises(SessionNotFoundError):
                await AsyncSandbox.connect(mine.sandbox_id, **sandhold.options(KEY_B))


async def test_keep_leaves_the_session_and_connect_finds_it(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, keep=True, **sandhold.options()) as kept:
            await kept.run_code("n = 7")
        listed = [info.sandbox_id for info in await AsyncSandbox.list(**sandhold.options())]
        assert kept.sandbox_id in listed
        async with AsyncSandbox.connect(kept.sandbox_id, keep=False, **sandhold.options()) as again:
            assert (await again.run_code("n * 6")).text == "42"
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as dropped:
            pass
        listed = [info.sandbox_id for info in await AsyncSandbox.list(**sandhold.options())]
        assert kept.sandbox_id not in listed and dropped.sandbox_id not in listed


async def test_an_unreachable_server_raises_backend_unavailable() -> None:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with anyio.fail_after(SCENARIO_TIMEOUT), pytest.raises(BackendUnavailableError) as failed:
            await AsyncSandbox.create(url=f"http://127.0.0.1:{port}", api_key="sandhold_x")
    assert failed.value.error_type == "backend_unavailable"


async def test_a_wrong_key_raises_unauthenticated(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch, rest_server(orch) as url:
        with anyio.fail_after(SCENARIO_TIMEOUT), pytest.raises(OrchestratorError) as refused:
            await AsyncSandbox.list(url=url, api_key=new_key())
    assert refused.value.error_type == "unauthenticated"
