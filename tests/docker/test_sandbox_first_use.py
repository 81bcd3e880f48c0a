"""The Sandbox API of issue 32 (items 2 and 6), in-process and remote as test_sandbox_api runs
it: ``processes.start()`` answers a typed handle (``wait()``, ``kill()``, ``logs()``,
``ports``), ``interrupt()`` stops a cell another caller runs, history says ``cancelled``, and a
remote sandbox finds its server by ``SANDHOLD_URL`` or, with a DeprecationWarning, by the old
``SANDHOLD_SERVER``. The shipped ``agent`` policy cuts a big print to 8 KB."""

from __future__ import annotations

import anyio
import pytest

from orchestrator import AsyncSandbox, Orchestrator
from orchestrator.images import ImageBuildResult
from orchestrator.sandbox import ProcessHandle
from tests.docker.test_http_api import KEY_A
from tests.docker.test_python_repl import config
from tests.docker.test_sandbox_api import POLICY, SCENARIO_TIMEOUT, Sandhold, sandhold
from tests.docker.test_streaming import rest_server

__all__ = ["sandhold"]  # the fixture, shared

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# A server loop in the sandbox, and how long to give it to listen.
SERVER = "python3 -m http.server 8765 --bind 127.0.0.1"
LISTEN_TIMEOUT = 30.0
POLL_S = 0.2


async def test_a_background_process_is_a_typed_handle(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy="shell", **sandhold.options()) as sandbox:
            short = await sandbox.processes.start("echo made; exit 3")
            assert isinstance(short, ProcessHandle) and short.process_id
            done = await short.wait(timeout=LISTEN_TIMEOUT)
            assert done.exit_code == 3 and not done.timed_out and "made" in done.stdout
            assert short.state == "exited"

            server = await sandbox.processes.start(SERVER)
            with anyio.fail_after(LISTEN_TIMEOUT):
                while 8765 not in server.ports:
                    assert await server.refresh() == "running"
                    await anyio.sleep(POLL_S)
            waited = await server.wait(timeout=0.5)
            assert waited.timed_out and waited.exit_code is None
            assert await server.kill() and server.state == "killed"
            assert isinstance(await server.logs(), str)


async def test_interrupt_stops_a_cell_run_by_another_caller(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            assert not (await sandbox.interrupt()).interrupted
            started = anyio.Event()
            ran: list[object] = []

            def heard(text: str) -> None:
                started.set()

            async def long_cell() -> None:
                code = "x = 5\nprint('go', flush=True)\nimport time\ntime.sleep(600)"
                ran.append(await sandbox.run_code(code, on_stdout=heard))

            async with anyio.create_task_group() as group:
                group.start_soon(long_cell)
                await started.wait()
                stopped = await sandbox.interrupt()
            assert stopped.interrupted and stopped.running == "python_repl.execute"
            assert not stopped.state_reset
            assert (await sandbox.run_code("x")).text == "5"
            outcomes = [item.outcome for item in await sandbox.history()]
            assert outcomes == ["cancelled", "ok"]


@pytest.mark.parametrize("variable", ["SANDHOLD_URL", "SANDHOLD_SERVER"])
async def test_the_server_is_found_by_its_one_variable_and_the_old_name_warns(
    worker_image: ImageBuildResult, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SANDHOLD_URL", "SANDHOLD_SERVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SANDHOLD_API_KEY", KEY_A)
    async with Orchestrator(config(worker_image.tag)) as orch, rest_server(orch) as url:
        monkeypatch.setenv(variable, url)
        await one_remote_cell(expect_warning=variable == "SANDHOLD_SERVER")


async def one_remote_cell(*, expect_warning: bool) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        if expect_warning:
            with pytest.warns(DeprecationWarning, match="SANDHOLD_URL"):
                sandbox = await AsyncSandbox.create(policy=POLICY)
        else:
            sandbox = await AsyncSandbox.create(policy=POLICY)
        async with sandbox:
            assert (await sandbox.run_code("6 * 7")).text == "42"


async def test_the_agent_policy_cuts_a_big_print_to_eight_kilobytes(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy="agent", **sandhold.options()) as sandbox:
            big = await sandbox.run_code("print('x' * 100_000)")
    assert big.error is None and len(big.stdout.encode()) <= 8192
    assert big.truncated
