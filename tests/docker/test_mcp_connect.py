"""``sandhold mcp --connect URL``: a stdio front that forwards to a running ``sandhold serve``,
driven by the official client as a client that starts one server per call does. Two consecutive
front processes share a session (a variable the first sets, the second sees); the server's JSON-RPC
errors come through unchanged; a server that has gone answers ``backend_unavailable`` and the
front keeps serving. Spoken to as JSON-RPC lines: the front passes the server's progress
notifications on, a client's cancel interrupts the cell (state kept), and EOF with a call in
flight ends the front at once, with nothing written after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.text import TextReceiveStream
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import INVALID_PARAMS

from orchestrator.images import ImageBuildResult
from orchestrator.tools import TOOLS
from tests.docker.test_mcp_stdio import SCENARIO_TIMEOUT, containers_of, ok
from tests.docker.test_serve import STOP_TIMEOUT, running

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def front(url: str, key: str, *extra: str) -> StdioServerParameters:
    """``sandhold mcp --connect``: no image or engine settings, the key from the environment."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SANDHOLD_")}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--connect", url, *extra],
        env={**env, "SANDHOLD_API_KEY": key},
    )


async def test_two_front_processes_share_a_session_of_one_server(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with Client(front(server.url, key)) as first:
                listed = {tool.name for tool in (await first.list_tools()).tools}
                assert listed == set(TOOLS)
                made = await ok(first, "python_repl", operation="execute", code="x = 41")
            async with Client(front(server.url, key)) as second:
                seen = await ok(
                    second,
                    "python_repl",
                    operation="execute",
                    session_id=made["session_id"],
                    code="x + 1",
                )
                assert seen["result_repr"] == "42" and not seen["created_new_session"]
                with pytest.raises(MCPError) as unknown:
                    await second.call_tool("nosuchtool", {"operation": "x"})
                assert unknown.value.code == INVALID_PARAMS

                server.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(STOP_TIMEOUT):
                    assert await server.process.wait() == 128 + signal.SIGTERM
                gone = await second.call_tool("python_repl", {"operation": "list_sessions"})
                assert gone.is_error and isinstance(gone.structured_content, dict)
                assert gone.structured_content["error_type"] == "backend_unavailable"
                assert "python_repl.list_sessions: backend_unavailable" in gone.content[0].text  # type: ignore[union-attr]
        assert containers_of(server.orchestrator_id) == []


async def test_a_wrong_key_is_the_servers_unauthenticated_error(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with Client(front(server.url, "sandhold_not-a-key")) as client:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("python_repl", {"operation": "list_sessions"})
                data: Any = refused.value.data
                assert isinstance(data, dict) and data["error_type"] == "unauthenticated"
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM


# A cell the tests below stop long before it ends; far beyond every wait of theirs.
LONG_CELL_S = 120
# The front ends this soon after EOF even with a call in flight (it waits for none).
FRONT_EXIT_TIMEOUT = 10.0


class Lines:
    """Newline-delimited JSON-RPC with one spawned front."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._text = TextReceiveStream(process.stdout)
        self._buffer = ""

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def receive(self) -> dict[str, Any] | None:
        """The next frame, or None at the end of stdout."""
        while "\n" not in self._buffer:
            try:
                self._buffer += await self._text.receive()
            except anyio.EndOfStream:
                return None
        line, self._buffer = self._buffer.split("\n", 1)
        return dict(json.loads(line))

    async def answer(self, request_id: int) -> dict[str, Any]:
        while (frame := await self.receive()) is not None:
            if frame.get("id") == request_id:
                return frame
        raise AssertionError(f"stdout ended before the answer to {request_id}")

    async def call(self, request_id: int, **arguments: Any) -> dict[str, Any]:
        params = {"name": "python_repl", "arguments": arguments}
        await self.send({"id": request_id, "method": "tools/call", "params": params})
        structured: dict[str, Any] = (await self.answer(request_id))["result"]["structuredContent"]
        return structured


async def spawn_front(url: str, key: str) -> tuple[anyio.abc.Process, Lines]:
    parameters = front(url, key)
    process = await anyio.open_process(
        [parameters.command, *parameters.args], env=parameters.env, stderr=subprocess.DEVNULL
    )
    lines = Lines(process)
    initialize = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    }
    await lines.send({"id": 0, "method": "initialize", "params": initialize})
    await lines.answer(0)
    await lines.send({"method": "notifications/initialized"})
    return process, lines


async def test_the_front_passes_progress_on_and_a_cancel_interrupts_the_cell_keeping_state(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        with anyio.fail_after(SCENARIO_TIMEOUT):
            process, lines = await spawn_front(server.url, key)
            async with process:
                made = await lines.call(1, operation="execute", code="x = 1")
                session_id = made["session_id"]
                code = f"x = 2\nprint('tick', flush=True)\nimport time\ntime.sleep({LONG_CELL_S})"
                arguments = {"operation": "execute", "session_id": session_id, "code": code}
                params = {
                    "name": "python_repl",
                    "arguments": arguments,
                    "_meta": {"progressToken": 9},
                }
                await lines.send({"id": 2, "method": "tools/call", "params": params})
                progress = await lines.receive()
                assert progress is not None and progress["method"] == "notifications/progress"
                assert progress["params"]["progressToken"] == 9
                assert "tick" in progress["params"]["message"]
                await lines.send({"method": "notifications/cancelled", "params": {"requestId": 2}})
                with anyio.fail_after(LONG_CELL_S / 4):  # the cell was interrupted, not waited for
                    kept = await lines.call(3, operation="execute", session_id=session_id, code="x")
                assert kept["result_repr"] == "2" and not kept["state_reset"]
                await lines.call(4, operation="destroy", session_id=session_id)
                assert process.stdin is not None
                await process.stdin.aclose()
                assert await process.wait() == 0
        await stop(server)


async def test_eof_with_a_call_in_flight_ends_the_front_at_once_writing_nothing_more(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        with anyio.fail_after(SCENARIO_TIMEOUT):
            process, lines = await spawn_front(server.url, key)
            async with process:
                made = await lines.call(1, operation="execute", code="x = 1")
                code = f"import time\ntime.sleep({LONG_CELL_S})"
                arguments = {"operation": "execute", "session_id": made["session_id"], "code": code}
                params = {"name": "python_repl", "arguments": arguments}
                await lines.send({"id": 2, "method": "tools/call", "params": params})
                assert process.stdin is not None
                await process.stdin.aclose()
                with anyio.fail_after(FRONT_EXIT_TIMEOUT):
                    assert await process.wait() == 0
                    assert await lines.receive() is None  # no answer after EOF
        await stop(server)


async def stop(server: Any) -> None:
    """SIGTERM: the server ends every session it holds, and no container is left."""
    server.process.send_signal(signal.SIGTERM)
    with anyio.fail_after(STOP_TIMEOUT):
        assert await server.process.wait() == 128 + signal.SIGTERM
    assert containers_of(server.orchestrator_id) == []
