"""A result holding lone surrogates (text no UTF-8 encoder accepts) reaches the caller over every
interface, with each replaced by U+FFFD and ``unicode_replaced`` set, and the server and the
caller's other sessions keep working: the Python API, ``sandhold mcp`` (stdio) with the official
client, and ``sandhold serve``'s REST API and ``/mcp``."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from orchestrator.tools._unicode import REPLACEMENT, UNICODE_REPLACED
from tests.docker.test_mcp_http import client_with_key
from tests.docker.test_mcp_stdio import (
    SCENARIO_TIMEOUT,
    Frames,
    initialize_params,
    new_orchestrator_id,
    ok,
    server_env,
    stdio_server,
)
from tests.docker.test_python_repl import config
from tests.docker.test_serve import STOP_TIMEOUT, running

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Each cell puts a lone surrogate in other fields of the result. (The worker already escapes
# what user code writes to stdout and stderr; a repr and an exception's text it passes on.)
CELLS = {
    ("result_repr",): "class R:\n    def __repr__(self):\n        return '\\udfff'\nR()",
    ("error_message", "traceback"): "raise ValueError('bad \\ud800')",
    ("error_message",): "assert False, 'x\\udc80'",
}


def check_replaced(structured: dict[str, Any], fields: tuple[str, ...]) -> None:
    """The cell's answer arrived whole: valid UTF-8, the surrogate replaced, and said so."""
    json.dumps(structured, ensure_ascii=False).encode("utf-8")
    assert structured[UNICODE_REPLACED] is True, structured
    for field in fields:
        assert REPLACEMENT in structured[field], (field, structured)


def stays_valid(structured: dict[str, Any]) -> bool:
    return UNICODE_REPLACED not in structured


async def test_the_python_api_answers_lone_surrogates_replaced(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        other = await orch.call("python_repl", {"operation": "execute", "code": "x = 1"})
        sid = other.structured["session_id"]
        for field, code in CELLS.items():
            result = await orch.call("python_repl", {"operation": "execute", "code": code})
            check_replaced(result.structured, field)
            result.text.encode("utf-8")
        again = await orch.call(
            "python_repl", {"operation": "execute", "session_id": sid, "code": "x + 1"}
        )
        assert again.structured["result_repr"] == "2" and stays_valid(again.structured)


async def test_a_lone_surrogate_in_the_arguments_is_answered_as_valid_text(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        result = await orch.call("python_repl", {"operation": "\ud800"})
        assert result.structured["error_type"] == "invalid_argument"
        assert result.structured[UNICODE_REPLACED] is True
        assert result.structured["operation"] == REPLACEMENT
        json.dumps(result.structured, ensure_ascii=False).encode("utf-8")


async def _mcp_cells_then_other_session(client: Client) -> None:
    sid = (await ok(client, "python_repl", operation="execute", code="x = 1"))["session_id"]
    for field, code in CELLS.items():
        result = await client.call_tool("python_repl", {"operation": "execute", "code": code})
        assert isinstance(result.structured_content, dict), result
        check_replaced(result.structured_content, field)
        assert REPLACEMENT in result.content[0].text  # type: ignore[union-attr]
    again = await ok(client, "python_repl", operation="execute", session_id=sid, code="x + 1")
    assert again["result_repr"] == "2"


async def test_sandhold_mcp_answers_lone_surrogates_and_keeps_serving(
    worker_image: ImageBuildResult,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            await _mcp_cells_then_other_session(client)
            assert (await ok(client, "python_repl", operation="list_sessions"))["count"] == 4


async def test_sandhold_mcp_answers_a_lone_surrogate_in_the_arguments_and_keeps_serving(
    worker_image: ImageBuildResult,
) -> None:
    """The SDK's client cannot send one; a raw frame can, as ``\\ud800`` in its JSON. The SDK
    drops a frame it cannot read as text; what matters is that serving goes on."""
    process = await anyio.open_process(
        [sys.executable, "-m", "orchestrator.cli", "mcp"],
        env=server_env(worker_image.tag, new_orchestrator_id()),
        stderr=None,
    )
    try:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            frames = Frames(process)
            await frames.request("initialize", initialize_params())
            await frames.notify("notifications/initialized")
            for arguments in ({"operation": "\ud800"}, {"operation": "list_sessions", "\udc00": 1}):
                await frames.send("tools/call", {"name": "python_repl", "arguments": arguments})
            listing = {"name": "python_repl", "arguments": {"operation": "list_sessions"}}
            reply = await frames.request("tools/call", listing)
            assert reply["result"]["structuredContent"]["success"], reply
            assert process.returncode is None
            assert process.stdin is not None
            await process.stdin.aclose()  # EOF: the server tears down and exits 0
            assert await process.wait() == 0
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.aclose()


async def test_sandhold_serve_answers_lone_surrogates_over_rest_and_mcp_and_keeps_serving(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        headers = {"Authorization": f"Bearer {key}"}
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=SCENARIO_TIMEOUT
            ) as http:
                kept = (await http.post("/v1/sessions", json={"code": "y = 1"})).json()
                for field, code in CELLS.items():
                    answer = await http.post(
                        "/v1/python_repl", json={"operation": "execute", "code": code}
                    )
                    assert answer.status_code == 200, answer.text
                    check_replaced(answer.json(), field)
                again = await http.post(
                    "/v1/python_repl",
                    json={"operation": "execute", "session_id": kept["session_id"], "code": "y"},
                )
                assert again.json()["result_repr"] == "1"
            async with client_with_key(f"{server.url}/mcp", key) as client:
                await _mcp_cells_then_other_session(client)
        assert server.process.returncode is None
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM
