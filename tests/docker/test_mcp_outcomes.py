"""What user code did is a completed call; only a failure of the call itself is an MCP tool error
(``isError``). Over ``sandhold mcp`` with the official client: two failing cells in a row and a cell
that times out answer ``isError: false`` with ``success: false`` and the exception or
``timed_out``, and the session keeps its state; a wrong argument or an unknown session is
``isError: true``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult

from orchestrator.images import ImageBuildResult
from tests.docker.test_mcp_stdio import SCENARIO_TIMEOUT, new_orchestrator_id, ok, stdio_server

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def completed(result: CallToolResult) -> dict[str, Any]:
    """A call that did its job, whatever the code did: no tool error, a structured result."""
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


async def test_user_code_failures_are_completed_calls_and_call_failures_are_tool_errors(
    worker_image: ImageBuildResult,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            sid = (await ok(client, "python_repl", operation="execute", code="x = 1"))["session_id"]

            async def execute(code: str, **more: Any) -> CallToolResult:
                arguments = {"operation": "execute", "session_id": sid, "code": code, **more}
                return await client.call_tool("python_repl", arguments)

            for code, error_type in (("1 / 0", "ZeroDivisionError"), ("undefined", "NameError")):
                failed = completed(await execute(code))
                assert failed["success"] is False and failed["error_type"] == error_type
                assert failed["traceback"] and not failed["timed_out"]

            late = completed(await execute("x = 2\nwhile True:\n    pass", timeout_s=1))
            assert late["success"] is False and late["timed_out"] is True
            assert late["error_type"] == "timeout" and late["state_reset"] is False
            kept = await ok(client, "python_repl", operation="execute", session_id=sid, code="x")
            assert kept["result_repr"] == "2"

            for arguments, error_type in (
                (
                    {"operation": "execute", "session_id": "0" * 32, "code": "1"},
                    "session_not_found",
                ),
                ({"operation": "execute", "code": 1}, "invalid_argument"),
            ):
                refused = await client.call_tool("python_repl", arguments)
                assert refused.is_error, refused
                assert isinstance(refused.structured_content, dict)
                assert refused.structured_content["error_type"] == error_type
