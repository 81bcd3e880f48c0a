"""``Sandbox``, the blocking twin of ``AsyncSandbox``, without an event loop of the caller's:
in-process through a ``SyncOrchestrator``'s portal (the same behaviours as the async tests), and
remote with a portal of its own (a smoke test against a ``sandhold serve`` on loopback)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from orchestrator import (
    PolicyViolationError,
    Sandbox,
    SessionNotFoundError,
    SyncOrchestrator,
)
from orchestrator.images import ImageBuildResult
from tests.docker.test_http_api import KEY_A, KEY_B
from tests.docker.test_python_repl import config
from tests.docker.test_rich_results import CLASSES, png_size
from tests.docker.test_streaming import CELL, EXPECTED_STDOUT, Arrivals, rest_server

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

POLICY = "unrestricted-python"


@pytest.fixture
def sandhold(worker_image: ImageBuildResult) -> Iterator[SyncOrchestrator]:
    with SyncOrchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


def test_state_rich_results_and_streaming_through_the_blocking_twin(
    sandhold: SyncOrchestrator,
) -> None:
    arrivals = Arrivals()
    with Sandbox.create(orchestrator=sandhold, policy=POLICY) as sandbox:
        sandbox.run_code("x = 41")
        assert sandbox.run_code("x + 1").text == "42"
        sandbox.run_code(CLASSES)
        chart = sandbox.run_code("Chart()").results[0]
        assert chart.png is not None and png_size(chart.png) == (32, 20)
        execution = sandbox.run_code(
            CELL,
            on_stdout=lambda text: arrivals.add("stdout", text),
            on_stderr=lambda text: arrivals.add("stderr", text),
        )
        ended = time.monotonic()
        assert sandbox.inspect("x").repr == "41"
    arrivals.check_came_before(ended)
    assert execution.stdout == EXPECTED_STDOUT == arrivals.text("stdout")


def test_errors_files_and_commands_through_the_blocking_twin(sandhold: SyncOrchestrator) -> None:
    with Sandbox.create(orchestrator=sandhold, policy=POLICY) as sandbox:
        failed = sandbox.run_code("1 / 0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        with pytest.raises(PolicyViolationError) as refused:
            sandbox.commands.run("sudo true")
        assert refused.value.error_type == "policy"
        sandbox.files.write("a.bin", b"\x00\x01\xff")
        sandbox.files.write("a.txt", "text")
        assert sandbox.files.read("a.bin") == b"\x00\x01\xff"
        assert sandbox.files.read("a.txt") == "text"
        assert sandbox.commands.run("cat a.txt; bash -c 'exit 4'").exit_code == 4
        handle = sandbox.commands.run("read v; echo got $v", background=True)
        handle.send_stdin("y\n")
        assert handle.wait(timeout=30).stdout == "got y\n"
        sleeper = sandbox.commands.run("sleep 600", background=True)
        sleeper.kill()
        assert sleeper.wait(timeout=30).exit_code != 0


def test_keep_and_connect_through_the_blocking_twin(sandhold: SyncOrchestrator) -> None:
    with Sandbox.create(orchestrator=sandhold, policy=POLICY, keep=True) as kept:
        kept.run_code("n = 6")
    assert kept.sandbox_id in [i.sandbox_id for i in Sandbox.list(orchestrator=sandhold)]
    with Sandbox.connect(kept.sandbox_id, orchestrator=sandhold, keep=False) as again:
        assert again.run_code("n * 7").text == "42"
    assert kept.sandbox_id not in [i.sandbox_id for i in Sandbox.list(orchestrator=sandhold)]


def test_a_remote_blocking_sandbox_runs_code_and_keeps_tenants_apart(
    sandhold: SyncOrchestrator,
) -> None:
    url = sandhold.portal.wrap_async_context_manager(rest_server(sandhold.orchestrator))
    with url as base:
        with Sandbox.create(url=base, api_key=KEY_A, policy=POLICY) as sandbox:
            sandbox.run_code("y = 2")
            assert sandbox.run_code("y ** 5").text == "32"
            sandbox.files.write("r.txt", "remote")
            assert sandbox.files.read("r.txt") == "remote"
            assert sandbox.commands.run("echo $((6 * 7))").stdout == "42\n"
            theirs = Sandbox.list(url=base, api_key=KEY_B)
            assert sandbox.sandbox_id not in [i.sandbox_id for i in theirs]
            with pytest.raises(SessionNotFoundError):
                Sandbox.connect(sandbox.sandbox_id, url=base, api_key=KEY_B)
        mine = Sandbox.list(url=base, api_key=KEY_A)
        assert sandbox.sandbox_id not in [i.sandbox_id for i in mine]
