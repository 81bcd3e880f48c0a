"""``kill -9`` of a working ``sandhold serve``, then a restart on the same registry: the sessions it
knew are re-adopted with their REPL state, code history and background processes; the orphans
(its terminals, a half-warmed pool) are gone; nothing else of its orchestrator id is left. And a
``--keep-sessions`` stop leaves sessions for the next start the same way."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import docker
import httpx
import pytest

from orchestrator._core.tenants import LOCAL_KEY_FILE
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID
from tests.docker.test_mcp_stdio import containers_of
from tests.docker.test_serve import CALL_TIMEOUT, SERVE, STOP_TIMEOUT, running, serve_env

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PROCESS_TABLE = (
    "import os\n"
    "for p in sorted(filter(str.isdigit, os.listdir('/proc')), key=int):\n"
    "    try:\n"
    "        print(open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n"
    "    except OSError:\n"
    "        pass\n"
)


def command_lines(container_id: str) -> list[str]:
    """Every process in the container, as its command line (read as root through the engine)."""
    client = docker.from_env(timeout=30)
    try:
        result = client.containers.get(container_id).exec_run(["python3", "-c", PROCESS_TABLE])
        return [line for line in result.output.decode().splitlines() if "PROCESS_TABLE" not in line]
    finally:
        client.close()


async def call(http: httpx.AsyncClient, tool: str, **arguments: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        response = await http.post(f"/v1/{tool}", json=arguments)
    result: dict[str, Any] = response.json()
    assert (response.status_code == 200) == result["success"], response.text
    return result


@pytest.fixture
def orchestrator_id() -> Iterator[str]:
    """An id for the servers of one test; whatever a killed server left under it is removed."""
    chosen = f"test-restart-{RUN_ID}-{secrets.token_hex(4)}"
    try:
        yield chosen
    finally:
        engine = docker.from_env(timeout=30)
        try:
            for container_id in containers_of(chosen):
                engine.api.remove_container(container_id, force=True)
        finally:
            engine.close()


async def unanswered(http: httpx.AsyncClient, arguments: dict[str, Any]) -> None:
    """A call whose server dies under it."""
    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/v1/python_repl", json=arguments)


def client(url: str, key: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT, headers=headers)


async def test_kill_9_then_restart_re_adopts_sessions_and_leaves_no_orphan(
    worker_image: ImageBuildResult, tmp_path: Path, orchestrator_id: str
) -> None:
    data_dir = tmp_path / "data"
    async with running(
        worker_image.tag,
        tmp_path,
        "--pool",
        "1",
        data_dir=data_dir,
        orchestrator_id=orchestrator_id,
    ) as server:
        key = (data_dir / LOCAL_KEY_FILE).read_text().strip()
        async with client(server.url, key) as http:
            first = await call(http, "python_repl", operation="execute", code="x = 41")
            session_id = first["session_id"]
            terminal = await call(
                http, "terminal", operation="start", session_id=session_id, command="sleep 1001"
            )
            process = await call(
                http, "process", operation="start", session_id=session_id, command="sleep 1002"
            )
            await call(http, "terminal", operation="run", session_id=session_id, command="A=1")
            # A call in flight when the server dies: the worker finishes the cell on its own.
            async with anyio.create_task_group() as tg:
                slow = {"operation": "execute", "session_id": session_id}
                code = "import time\ntime.sleep(2)\ny = 1"
                tg.start_soon(unanswered, http, {**slow, "code": code})
                await anyio.sleep(0.3)
                server.process.kill()
                with anyio.fail_after(STOP_TIMEOUT):
                    await server.process.wait()
                tg.cancel_scope.cancel()
        left = containers_of(orchestrator_id)
        assert len(left) == 2  # the session's, and the warm pool's
        # The terminal's command ends with the server (its spawner reads EOF and kills what
        # it started); the background process lives on in the session's container.
        session_container = next(c for c in left if "sleep 1002" in "".join(command_lines(c)))

    async with running(
        worker_image.tag, tmp_path, data_dir=data_dir, orchestrator_id=orchestrator_id
    ) as server:
        assert "re-adopted 1 session(s), reaped 1 container(s)" in server.reconciled
        assert containers_of(orchestrator_id) == [session_container]
        async with client(server.url, key) as http:
            again = await call(
                http, "python_repl", operation="execute", session_id=session_id, code="x + 1"
            )
            assert again["success"] and again["result_repr"] == "42", again
            assert not again["state_reset"]
            history = await call(http, "python_repl", operation="history", session_id=session_id)
            assert [e["code"] for e in history["history"]][:1] == ["x = 41"]
            listed = await call(http, "process", operation="list", session_id=session_id)
            ids = {p["process_id"]: p["state"] for p in listed["processes"]}
            assert ids.get(process["process_id"]) == "running"
            # Found by its id alone: the registry kept which session it belongs to.
            output = await call(
                http, "process", operation="read_output", process_id=process["process_id"]
            )
            assert output["success"], output
            read = await call(
                http, "terminal", operation="read", terminal_id=terminal["terminal_id"]
            )
            assert read["error_type"] == "session_not_found"  # it was an orphan: killed
            lines = command_lines(session_container)
            assert not any("sleep 1001" in line for line in lines), lines
            assert sum("repl_worker.py" in line for line in lines) == 1, lines
            assert any("sleep 1002" in line for line in lines), lines

        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    assert containers_of(orchestrator_id) == []


async def test_keep_sessions_stop_leaves_them_for_the_next_start(
    worker_image: ImageBuildResult, tmp_path: Path, orchestrator_id: str
) -> None:
    data_dir = tmp_path / "data"
    start = {"data_dir": data_dir, "orchestrator_id": orchestrator_id}
    async with running(worker_image.tag, tmp_path, "--keep-sessions", **start) as server:
        key = (data_dir / LOCAL_KEY_FILE).read_text().strip()
        async with client(server.url, key) as http:
            first = await call(http, "python_repl", operation="execute", code="kept = 'yes'")
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM
    assert len(containers_of(orchestrator_id)) == 1

    async with running(worker_image.tag, tmp_path, **start) as server:
        assert "re-adopted 1 session(s), reaped 0 container(s)" in server.reconciled
        async with client(server.url, key) as http:
            again = await call(
                http,
                "python_repl",
                operation="execute",
                session_id=first["session_id"],
                code="kept",
            )
            assert again["result_repr"] == "'yes'" and not again["state_reset"], again
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    assert containers_of(orchestrator_id) == []


async def test_a_second_server_on_the_same_registry_is_refused(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    async with running(worker_image.tag, tmp_path, data_dir=data_dir) as server:
        env = serve_env(worker_image.tag, data_dir, server.orchestrator_id)
        second = await anyio.run_process(SERVE, env=env, check=False)
        assert second.returncode == 2
        assert b"in use by another running sandhold" in second.stderr, second.stderr
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
