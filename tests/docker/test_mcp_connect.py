"""``sandhold mcp --connect URL``: a stdio front that forwards to a running ``sandhold serve``,
driven by the official client as a client that starts one server per call does. Two consecutive
front processes share a session (a variable the first sets, the second sees); the server's JSON-RPC
errors come through unchanged; a server that has gone answers ``backend_unavailable`` and the
front keeps serving."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
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
