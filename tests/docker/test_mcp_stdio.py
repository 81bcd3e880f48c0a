"""``sandhold mcp`` driven by the MCP SDK's own client over stdio, against real containers: the tool
listing, the issue's scenario, a wrong argument, and teardown on EOF and on SIGTERM.

The scenario helpers here are shared with the HTTP test (``test_mcp_http.py``)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from typing import Any

import anyio
import docker
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import INVALID_PARAMS, CallToolResult

from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.images import ImageBuildResult
from orchestrator.tools import TOOLS
from tests.conftest import RUN_ID, TEST_RUN_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CONTRACT_TOOLS = {"python_repl", "terminal", "process", "files"}
# A server process starts (imports, engine ping, image check) well within this.
STARTUP_TIMEOUT = 60.0
SCENARIO_TIMEOUT = 180.0
# The stdio client gives a server 2 s after EOF, then SIGTERM, then 2 s before SIGKILL; teardown
# of a handful of sessions fits in that, and the containers must be gone once the client is.
TEARDOWN_TIMEOUT = 30.0


# -- shared with the HTTP test ------------------------------------------------------------------


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    return await client.call_tool(tool, arguments)


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(client, tool, **arguments)
    structured = result.structured_content
    assert isinstance(structured, dict), result
    assert not result.is_error and structured["success"], structured
    text = result.content[0]
    assert text.type == "text" and text.text.startswith(f"{tool}.{arguments['operation']}: ok")
    return structured


async def check_tool_listing(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    # The contract's four, plus whatever else the tool layer serves (DESIGN allows a fifth).
    assert set(tools) >= CONTRACT_TOOLS and set(tools) == set(TOOLS)
    for tool in tools.values():
        assert tool.description and tool.title
        # Every tool has operations that write: no readOnlyHint (MCP's default: false).
        assert not (tool.annotations and tool.annotations.read_only_hint)
        assert tool.output_schema and tool.output_schema["required"] == ["success"]
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["required"] == ["operation"]
        operation = schema["properties"]["operation"]
        assert operation["enum"], tool.name
        # Each operation is described once, in the operation list, with what it requires.
        for name in operation["enum"]:
            assert f"{name}(" in operation["description"], (tool.name, name)
    assert "execute" in tools["python_repl"].input_schema["properties"]["operation"]["enum"]


async def run_scenario(client: Client) -> None:
    """Create a session, execute, run a shell command, start and list a background process,
    write and read a file, destroy."""
    created = await ok(client, "python_repl", operation="execute", code="x = 6 * 7\nx")
    assert created["created_new_session"] and created["result_repr"] == "42"
    sid = created["session_id"]
    again = await ok(client, "python_repl", operation="execute", session_id=sid, code="print(x+1)")
    assert again["stdout"] == "43\n" and not again["created_new_session"]

    shell = await ok(client, "terminal", operation="run", session_id=sid, command="echo hi; pwd")
    assert shell["stdout"] == "hi\n/workspace\n" and shell["exit_code"] == 0

    started = await ok(client, "process", operation="start", session_id=sid, command="sleep 300")
    listing = await ok(client, "process", operation="list", session_id=sid)
    listed = {p["process_id"]: p for p in listing["processes"]}
    assert listed[started["process_id"]]["state"] == "running"

    await ok(client, "files", operation="write", session_id=sid, path="notes/a.txt", content="hi")
    read = await ok(client, "files", operation="read", session_id=sid, path="notes/a.txt")
    assert read["content"] == "hi"

    await ok(client, "python_repl", operation="destroy", session_id=sid)
    assert (await ok(client, "python_repl", operation="list_sessions"))["count"] == 0


async def check_wrong_arguments(client: Client) -> None:
    wrong: list[tuple[str, dict[str, Any]]] = [
        ("python_repl", {"operation": "execute", "code": "1", "timeout_s": "5"}),
        ("python_repl", {"operation": "nope"}),
        ("files", {"operation": "read", "session_id": "x", "path": "a", "surprise": 1}),
    ]
    for tool, arguments in wrong:
        result = await client.call_tool(tool, arguments)
        structured = result.structured_content
        assert result.is_error and isinstance(structured, dict), result
        assert structured["success"] is False
        assert structured["error_type"] == "invalid_argument", structured
        assert structured["error_message"]
    # An unknown tool is no tool result but a JSON-RPC error: invalid params.
    with pytest.raises(MCPError) as refused:
        await client.call_tool("nosuchtool", {"operation": "execute"})
    assert refused.value.code == INVALID_PARAMS
    assert (await ok(client, "python_repl", operation="list_sessions"))["count"] == 0


def containers_of(orchestrator_id: str) -> list[str]:
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(
            all=True, filters={"label": f"{LABEL_ORCHESTRATOR}={orchestrator_id}"}
        )
        return [c["Id"] for c in found]
    finally:
        client.close()


# -- stdio --------------------------------------------------------------------------------------


def server_env(image: str, orchestrator_id: str) -> dict[str, str]:
    return {
        **os.environ,
        "SANDHOLD_IMAGE": image,
        "SANDHOLD_ORCHESTRATOR_ID": orchestrator_id,
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
    }


def stdio_server(image: str, orchestrator_id: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp"],
        env=server_env(image, orchestrator_id),
    )


def new_orchestrator_id() -> str:
    return f"test-mcp-{RUN_ID}-{secrets.token_hex(4)}"


async def test_the_server_lists_the_contract_tools_with_described_schemas(
    worker_image: ImageBuildResult,
) -> None:
    with anyio.fail_after(STARTUP_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            await check_tool_listing(client)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_scenario_runs_over_stdio_and_leaves_no_container(
    worker_image: ImageBuildResult, mode: str
) -> None:
    orchestrator_id = new_orchestrator_id()
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, orchestrator_id), mode=mode) as client:
            await run_scenario(client)
            # A session left open is the server's to tear down when the client goes.
            await ok(client, "python_repl", operation="execute", code="1")
            assert await anyio.to_thread.run_sync(containers_of, orchestrator_id)
    assert await anyio.to_thread.run_sync(containers_of, orchestrator_id) == []


async def test_a_wrong_argument_over_stdio_is_an_invalid_argument_error(
    worker_image: ImageBuildResult,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            await check_wrong_arguments(client)


async def test_sigterm_tears_down_every_session_while_stdin_is_still_open(
    worker_image: ImageBuildResult,
) -> None:
    orchestrator_id = new_orchestrator_id()
    process = await anyio.open_process(
        [sys.executable, "-m", "orchestrator.cli", "mcp"],
        env=server_env(worker_image.tag, orchestrator_id),
        stderr=None,
    )
    try:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            frames = Frames(process)
            await frames.request("initialize", initialize_params())
            await frames.notify("notifications/initialized")
            arguments = {"operation": "execute", "code": "1"}
            reply = await frames.request(
                "tools/call", {"name": "python_repl", "arguments": arguments}
            )
            assert reply["result"]["structuredContent"]["success"], reply
            assert await anyio.to_thread.run_sync(containers_of, orchestrator_id)
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(TEARDOWN_TIMEOUT):
            assert await process.wait() == 128 + signal.SIGTERM
        assert await anyio.to_thread.run_sync(containers_of, orchestrator_id) == []
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.aclose()


def initialize_params() -> dict[str, Any]:
    return {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "sandhold-test", "version": "0"},
    }


class Frames:
    """Raw newline-delimited JSON-RPC with a server process: stdin stays open until we close it."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._lines = TextReceiveStream(process.stdout)
        self._buffer = ""
        self._next_id = 1

    async def notify(self, method: str) -> None:
        await self._send({"jsonrpc": "2.0", "method": method})

    async def send(self, method: str, params: dict[str, Any]) -> int:
        """Send a request without waiting for its reply; its id."""
        request_id, self._next_id = self._next_id, self._next_id + 1
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return request_id

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = await self.send(method, params)
        while True:
            frame = json.loads(await self._line())
            if frame.get("id") == request_id:
                return dict(frame)

    async def _send(self, frame: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        await self._process.stdin.send((json.dumps(frame) + "\n").encode())

    async def _line(self) -> str:
        while "\n" not in self._buffer:
            self._buffer += await self._lines.receive()
        line, self._buffer = self._buffer.split("\n", 1)
        return line
