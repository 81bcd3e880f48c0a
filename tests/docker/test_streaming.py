"""Output that arrives before the cell ends, against real containers: the Python API's
``on_stdout``/``on_stderr``, MCP progress notifications (with a progress token) and log
notifications (without), over stdio and streamable HTTP, and REST's server-sent events over a
real socket. Each records when every piece came: the first must come well before the result,
and the result is what it is without streaming."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from mcp import Client

from orchestrator._api import Orchestrator
from orchestrator.http import HttpLimitsConfig, build_app
from orchestrator.images import ImageBuildResult
from tests.docker.test_http_api import KEY_A, KEYS
from tests.docker.test_mcp_http import client_with_key, serving
from tests.docker.test_mcp_stdio import SCENARIO_TIMEOUT, new_orchestrator_id, stdio_server
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Three lines, PAUSE_S apart: the first is out ~2 * PAUSE_S before the cell ends.
PAUSE_S = 0.6
CELL = (
    "import sys, time\n"
    f"for i in range(3):\n    print('tick', i, flush=True)\n    time.sleep({PAUSE_S})\n"
    "print('oops', file=sys.stderr)"
)
EXPECTED_STDOUT = "tick 0\ntick 1\ntick 2\n"
CALL_TIMEOUT = 60


class Arrivals:
    """Pieces of output with the time each came."""

    def __init__(self) -> None:
        self.pieces: list[tuple[float, str, str]] = []

    def add(self, stream: str, text: str) -> None:
        self.pieces.append((time.monotonic(), stream, text))

    def text(self, stream: str) -> str:
        return "".join(text for _, name, text in self.pieces if name == stream)

    def check_came_before(self, ended: float) -> None:
        assert self.pieces, "no output was streamed"
        first = self.pieces[0][0]
        assert ended - first > PAUSE_S, (ended - first, self.pieces)


async def test_python_api_callbacks_get_output_before_the_cell_ends(
    worker_image: ImageBuildResult,
) -> None:
    arrivals = Arrivals()
    async with Orchestrator(config(worker_image.tag, default_policy="unrestricted-python")) as orch:
        with anyio.fail_after(CALL_TIMEOUT):
            result = await orch.call(
                "python_repl",
                {"operation": "execute", "code": CELL},
                on_stdout=lambda text: arrivals.add("stdout", text),
                on_stderr=lambda text: arrivals.add("stderr", text),
            )
            ended = time.monotonic()
    arrivals.check_came_before(ended)
    assert result.structured["stdout"] == EXPECTED_STDOUT == arrivals.text("stdout")
    assert arrivals.text("stderr") == result.structured["stderr"] == "oops\n"


async def test_a_callback_that_raises_does_not_break_the_cell(
    worker_image: ImageBuildResult,
) -> None:
    def broken(text: str) -> None:
        raise RuntimeError("listener bug")

    async with Orchestrator(config(worker_image.tag, default_policy="unrestricted-python")) as orch:
        with anyio.fail_after(CALL_TIMEOUT):
            result = await orch.call(
                "python_repl", {"operation": "execute", "code": CELL}, on_stdout=broken
            )
            sid = result.structured["session_id"]
            assert result.structured["stdout"] == EXPECTED_STDOUT
            again = await orch.call(
                "python_repl", {"operation": "execute", "session_id": sid, "code": "i"}
            )
            assert again.structured["result_repr"] == "2"


async def progress_run(client: Client) -> tuple[Arrivals, float, dict[str, Any]]:
    arrivals = Arrivals()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        arrivals.add("any", message or "")

    result = await client.call_tool(
        "python_repl",
        {"operation": "execute", "code": CELL, "policy": "unrestricted-python"},
        progress_callback=on_progress,
    )
    assert result.structured_content is not None
    return arrivals, time.monotonic(), result.structured_content


async def test_mcp_stdio_sends_progress_notifications_while_the_cell_runs(
    worker_image: ImageBuildResult,
) -> None:
    server = stdio_server(worker_image.tag, new_orchestrator_id())
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(server) as client:
            arrivals, ended, structured = await progress_run(client)
    arrivals.check_came_before(ended)
    assert arrivals.text("any") == EXPECTED_STDOUT + "oops\n"
    assert structured["stdout"] == EXPECTED_STDOUT


async def test_without_a_progress_token_output_comes_as_log_notifications_when_asked(
    worker_image: ImageBuildResult,
) -> None:
    arrivals = Arrivals()

    async def on_log(params: Any) -> None:
        data = params.data
        assert params.logger == f"sandhold.{data['stream']}"
        arrivals.add(data["stream"], data["text"])

    server = stdio_server(worker_image.tag, new_orchestrator_id())
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(server, logging_callback=on_log, log_level="info") as client:
            result = await client.call_tool(
                "python_repl",
                {"operation": "execute", "code": CELL, "policy": "unrestricted-python"},
            )
            ended = time.monotonic()
    arrivals.check_came_before(ended)
    assert arrivals.text("stdout") == EXPECTED_STDOUT and arrivals.text("stderr") == "oops\n"
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == EXPECTED_STDOUT


async def test_mcp_over_http_sends_progress_on_the_calls_stream(
    worker_image: ImageBuildResult,
) -> None:
    async with (
        Orchestrator(config(worker_image.tag)) as orch,
        serving(orch, lambda: "default") as url,
    ):
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with client_with_key(url, None) as client:
                arrivals, ended, structured = await progress_run(client)
    arrivals.check_came_before(ended)
    assert structured["stdout"] == EXPECTED_STDOUT


@contextlib.asynccontextmanager
async def rest_server(orch: Orchestrator) -> AsyncIterator[str]:
    """The REST app on a loopback socket (not ASGITransport, which buffers a whole response)."""
    app = build_app(orch, KEYS, mcp=False, limits=HttpLimitsConfig())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


async def test_rest_streams_server_sent_events_then_the_result(
    worker_image: ImageBuildResult,
) -> None:
    arrivals = Arrivals()
    events: list[tuple[str, dict[str, Any]]] = []
    headers = {"Authorization": f"Bearer {KEY_A}"}
    async with (
        Orchestrator(config(worker_image.tag, default_policy="unrestricted-python")) as orch,
        rest_server(orch) as base,
        httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http,
    ):
        with anyio.fail_after(CALL_TIMEOUT):
            sid = (await http.post("/v1/sessions", json={"code": "1"})).json()["session_id"]
            request = http.stream(
                "POST",
                f"/v1/sessions/{sid}/execute",
                json={"code": CELL},
                headers={"Accept": "text/event-stream"},
            )
            async with request as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.headers["x-sandhold-call-id"]
                async for name, data in sse_events(response):
                    events.append((name, data))
                    if name != "result":
                        arrivals.add(name, data["text"])
            ended = time.monotonic()
            plain = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "i"})
    arrivals.check_came_before(ended)
    names = [name for name, _ in events]
    assert names[-1] == "result" and names.count("result") == 1
    result = events[-1][1]
    assert result["success"] and result["stdout"] == EXPECTED_STDOUT == arrivals.text("stdout")
    assert arrivals.text("stderr") == "oops\n"
    assert plain.json()["result_repr"] == "2"  # without Accept: plain JSON, state kept


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    name = None
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and name is not None:
            yield name, json.loads(line.removeprefix("data: "))


async def test_a_flood_streams_no_more_than_the_reply_keeps(worker_image: ImageBuildResult) -> None:
    arrivals = Arrivals()
    async with Orchestrator(config(worker_image.tag, default_policy="unrestricted-python")) as orch:
        cap = orch.policy("unrestricted-python").output.max_stream_bytes
        with anyio.fail_after(CALL_TIMEOUT):
            result = await orch.call(
                "python_repl",
                {"operation": "execute", "code": "print('x' * 2_000_000)"},
                on_stdout=lambda text: arrivals.add("stdout", text),
            )
    structured = result.structured
    assert structured["truncated"] is True and structured["stdout_bytes"] == 2_000_001
    assert len(arrivals.text("stdout")) <= cap
    assert arrivals.text("stdout") == structured["stdout"]


async def test_a_cells_env_is_seen_by_that_cell_only(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag, default_policy="unrestricted-python")) as orch:
        with anyio.fail_after(CALL_TIMEOUT):
            code = "import os, subprocess\n(os.environ.get('TOKEN'), subprocess.run("
            code += "['sh', '-c', 'echo $TOKEN'], capture_output=True, text=True).stdout)"
            first = await orch.call(
                "python_repl", {"operation": "execute", "code": code, "env": {"TOKEN": "s3cret"}}
            )
            assert first.structured["result_repr"] == "('s3cret', 's3cret\\n')"
            sid = first.structured["session_id"]
            after = await orch.call(
                "python_repl", {"operation": "execute", "session_id": sid, "code": code}
            )
            assert after.structured["result_repr"] == "(None, '\\n')"
            refused = await orch.call(
                "python_repl",
                {
                    "operation": "execute",
                    "session_id": sid,
                    "code": "1",
                    "env": {"LD_PRELOAD": "x"},
                },
            )
            assert refused.structured["error_type"] == "policy"
            still = await orch.call(
                "python_repl", {"operation": "execute", "session_id": sid, "code": "2"}
            )
            assert still.structured["result_repr"] == "2"
