"""A call whose caller goes away mid-cell (a client's read timeout, which the MCP SDK follows with
``notifications/cancelled``; a dropped HTTP connection; a cancelled task) interrupts its cell as a
timeout would, and the session's next call finds the worker idle with its state
(``state_reset: false``), never the stale reply of the cell before. Over stdio, over ``/mcp`` of
``sandhold serve``, over its REST routes (a client that closes its socket mid-request), and through
the Python API; the cancelled call is in the audit log as ``cancelled``."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError

from orchestrator._api import Orchestrator
from orchestrator.backend.docker import DockerBackend
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from orchestrator.session.repl.interpreter import FRAME_SLACK_BYTES, worker_config
from orchestrator.session.repl.protocol import ExecuteReply, payload
from orchestrator.session.repl.worker_process import WorkerProcess
from tests.conftest import ContainerFactory
from tests.docker.test_audit_trail import records
from tests.docker.test_mcp_http import client_with_key
from tests.docker.test_mcp_stdio import STARTUP_TIMEOUT, new_orchestrator_id, stdio_server
from tests.docker.test_python_repl import config
from tests.docker.test_serve import STOP_TIMEOUT, running

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# The cell outsleeps every bound below: a next call answered within NEXT_CALL_TIMEOUT proves the
# cell was interrupted, not waited out.
LONG_CELL = "y = 1\nimport time\ntime.sleep(600)"
# The client gives up on the long cell after this; the cell has long been sent by then.
CLIENT_TIMEOUT = 1.5
# The interrupt's exec (~60 ms), the policy's kill grace (2 s), a loaded machine.
NEXT_CALL_TIMEOUT = 30.0
# A session's creation over MCP: a container and a ready worker on a loaded machine.
CALL_TIMEOUT = 60.0


async def create(call: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> str:
    with anyio.fail_after(CALL_TIMEOUT):
        created = await call({"operation": "execute", "code": "x = 41"})
    assert created["success"], created
    return str(created["session_id"])


async def check_next_call_keeps_the_state(
    call: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]], session_id: str
) -> None:
    """The next execute on the session answers at once, sees what was set before and in the
    interrupted cell, and is told its state was kept."""
    with anyio.fail_after(NEXT_CALL_TIMEOUT):
        after = await call({"operation": "execute", "session_id": session_id, "code": "x + y"})
    assert after["success"], after
    assert after["result_repr"] == "42" and after["state_reset"] is False, after


def cancelled_records(audit_dir: Path, session_id: str) -> list[dict[str, object]]:
    found = records(audit_dir)
    return [r for r in found if r["session_id"] == session_id and r.get("outcome") == "cancelled"]


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


# -- MCP, the official client -------------------------------------------------------------------


def mcp_call(client: Client) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def call(arguments: dict[str, Any]) -> dict[str, Any]:
        result = await client.call_tool("python_repl", arguments)
        assert isinstance(result.structured_content, dict), result
        return result.structured_content

    return call


async def time_out_a_long_cell(client: Client, session_id: str) -> None:
    arguments = {"operation": "execute", "session_id": session_id, "code": LONG_CELL}
    with anyio.fail_after(NEXT_CALL_TIMEOUT), pytest.raises(MCPError):
        await client.call_tool("python_repl", arguments, read_timeout_seconds=CLIENT_TIMEOUT)


async def test_a_client_timeout_over_stdio_interrupts_the_cell_and_keeps_the_session(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit_dir = tmp_path / "audit"
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(audit_dir))
    server = stdio_server(worker_image.tag, new_orchestrator_id())
    with anyio.fail_after(STARTUP_TIMEOUT + 3 * CALL_TIMEOUT):
        async with Client(server) as client:
            session_id = await create(mcp_call(client))
            await time_out_a_long_cell(client, session_id)
            await check_next_call_keeps_the_state(mcp_call(client), session_id)
    [cancelled] = cancelled_records(audit_dir, session_id)
    assert cancelled["operation"] == "execute" and cancelled["error_type"] == "cancelled"
    assert cancelled["success"] is False


MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}


def tool_call(arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": "python_repl", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


async def drop_a_long_cell(url: str, key: str, session_id: str) -> None:
    """POST the long cell to /mcp and close the connection while it runs."""
    arguments = {"operation": "execute", "session_id": session_id, "code": LONG_CELL}
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as http:
        with anyio.move_on_after(CLIENT_TIMEOUT) as dropped:
            await http.post(f"{url}/mcp", json=tool_call(arguments), headers=headers)
    assert dropped.cancelled_caught


async def test_a_client_timeout_and_a_dropped_connection_on_serve_mcp_keep_the_session(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit_dir = tmp_path / "audit"
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(audit_dir))
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        with anyio.fail_after(4 * CALL_TIMEOUT):
            async with client_with_key(f"{server.url}/mcp", key) as client:
                session_id = await create(mcp_call(client))
                await time_out_a_long_cell(client, session_id)
                await check_next_call_keeps_the_state(mcp_call(client), session_id)
                await drop_a_long_cell(server.url, key, session_id)
                await check_next_call_keeps_the_state(mcp_call(client), session_id)
        server.process.send_signal(signal.SIGTERM)  # its sessions end with it
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM
    assert len(cancelled_records(audit_dir, session_id)) == 2


# -- REST ---------------------------------------------------------------------------------------


def rest_call(http: httpx.AsyncClient) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def call(arguments: dict[str, Any]) -> dict[str, Any]:
        response = await http.post("/v1/python_repl", json=arguments)
        assert response.status_code == 200, response.text
        return dict(response.json())

    return call


async def close_mid_request(url: str, key: str, path: str, arguments: dict[str, Any]) -> None:
    """Send one whole request on a raw socket and close it before the answer. The wait only
    lets the cell start; if it were too short, the cell's ``y = 1`` would be missing after."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(arguments).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    stream = await anyio.connect_tcp(host, int(port))
    try:
        await stream.send(head.encode() + body)
        with anyio.move_on_after(CLIENT_TIMEOUT):
            answered = await stream.receive()
            pytest.fail(f"answered before the cell could end: {answered!r}")
    finally:
        await stream.aclose()


@pytest.mark.parametrize(
    "path", ["/v1/sessions/{session_id}/execute", "/v1/python_repl"], ids=["resource", "tool"]
)
async def test_a_dropped_rest_connection_interrupts_its_cell_and_keeps_the_session(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    audit_dir = tmp_path / "audit"
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(audit_dir))
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=CALL_TIMEOUT
        ) as http:
            session_id = await create(rest_call(http))
            # Past NEXT_CALL_TIMEOUT, so a cell left to its own timeout fails the test.
            arguments = {
                "operation": "execute",
                "session_id": session_id,
                "code": LONG_CELL,
                "timeout_s": 300,
            }
            if path != "/v1/python_repl":
                del arguments["operation"], arguments["session_id"]
            target = path.format(session_id=session_id)
            with anyio.fail_after(NEXT_CALL_TIMEOUT):
                await close_mid_request(server.url, key, target, arguments)
            await check_next_call_keeps_the_state(rest_call(http), session_id)
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM
    [cancelled] = cancelled_records(audit_dir, session_id)
    assert cancelled["operation"] == "execute" and cancelled["error_type"] == "cancelled"


# -- the Python API -----------------------------------------------------------------------------


def api_call(orch: Orchestrator) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def call(arguments: dict[str, Any]) -> dict[str, Any]:
        return (await orch.call("python_repl", arguments)).structured

    return call


async def cancel_with_a_scope(orch: Orchestrator, arguments: dict[str, Any]) -> None:
    with anyio.move_on_after(CLIENT_TIMEOUT) as scope:
        await orch.call("python_repl", arguments)
    assert scope.cancelled_caught


async def cancel_the_task(orch: Orchestrator, arguments: dict[str, Any]) -> None:
    # asyncio's own cancellation of the task running the call, as an asyncio caller makes it.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(orch.call("python_repl", arguments), CLIENT_TIMEOUT)


@pytest.mark.parametrize("cancel", [cancel_with_a_scope, cancel_the_task])
async def test_a_cancelled_api_call_interrupts_its_cell_and_keeps_the_session(
    worker_image: ImageBuildResult,
    tmp_path: Path,
    cancel: Callable[[Orchestrator, dict[str, Any]], Awaitable[None]],
) -> None:
    async with Orchestrator(config(worker_image.tag, audit_dir=tmp_path)) as orch:
        session_id = await create(api_call(orch))
        arguments = {"operation": "execute", "session_id": session_id, "code": LONG_CELL}
        with anyio.fail_after(NEXT_CALL_TIMEOUT):
            await cancel(orch, arguments)
        await check_next_call_keeps_the_state(api_call(orch), session_id)
        # The cancelled cell ran and changed the state: it is in the history (issue 32.2).
        outcomes = [entry["outcome"] for entry in orch.history(session_id)]
        assert outcomes == ["ok", "cancelled", "ok"], outcomes
    [cancelled] = cancelled_records(tmp_path, session_id)
    assert cancelled["operation"] == "execute"


async def test_a_cancelled_inspect_of_a_slow_repr_is_interrupted_and_keeps_the_session(
    orch: Orchestrator,
) -> None:
    slow = "import time\nclass Slow:\n    def __repr__(self):\n        time.sleep(600)\n"
    session_id = await create(api_call(orch))
    setup = {
        "operation": "execute",
        "session_id": session_id,
        "code": f"{slow}slow = Slow()\ny = 1",
    }
    assert (await api_call(orch)(setup))["success"]
    inspect = {"operation": "inspect", "session_id": session_id, "variable_name": "slow"}
    await cancel_with_a_scope(orch, inspect)
    await check_next_call_keeps_the_state(api_call(orch), session_id)


# -- the worker's stream ------------------------------------------------------------------------


async def test_the_reply_to_an_abandoned_request_is_dropped_not_taken_for_the_next(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    """Without the Repl's interrupt: the stale reply comes first and is skipped by its id."""
    policy = load_policy("default")
    container_id = await make_container(policy)
    max_frame = policy.output.max_reply_bytes + FRAME_SLACK_BYTES
    with anyio.fail_after(CALL_TIMEOUT):
        worker = await WorkerProcess.start(
            docker_backend, container_id, worker_config(policy), max_frame=max_frame
        )
    try:
        with anyio.fail_after(NEXT_CALL_TIMEOUT):
            abandoned = await worker.send("execute", code="import time\ntime.sleep(1)\nx = 41")
            with anyio.move_on_after(0.1) as gave_up:
                await worker.receive_reply(abandoned)
            assert gave_up.cancelled_caught
            second = await worker.send("execute", code="x + 1")
            reply = await worker.receive_reply(second)
        assert reply.id == second and payload(reply, ExecuteReply).result_repr == "42"
    finally:
        await worker.kill()
