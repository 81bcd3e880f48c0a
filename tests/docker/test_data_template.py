"""Data work in the python-data template, end to end through each interface: a matplotlib line
chart comes back as a PNG of the figure's size (decoded, checked by its header), a DataFrame as
the last expression comes back as an HTML table, and ``display()`` of two objects gives two
results in order. The same checks run through the Python API, the official MCP client over
stdio, and REST."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from orchestrator._api import Orchestrator
from orchestrator.http import HttpLimitsConfig, build_app
from orchestrator.images import ImageBuildResult
from tests.docker.test_http_api import KEY_A, KEYS
from tests.docker.test_mcp_stdio import new_orchestrator_id, stdio_server
from tests.docker.test_python_repl import config
from tests.docker.test_rich_results import png_size

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# The template may be built on first use (about a minute with its wheels cached).
FIRST_CALL_TIMEOUT = 600
CALL_TIMEOUT = 60
SETUP = "import pandas as pd\nimport matplotlib.pyplot as plt\nimport numpy as np"
CHART = (
    "fig, ax = plt.subplots(figsize=(5, 3), dpi=100)\n"
    "ax.plot(np.arange(10), np.arange(10) ** 2)\n_ = ax.set_title('squares')"
)
FRAME = "df = pd.DataFrame({'x': [1, 2, 3], 'y': [4, 5, 6]})\ndisplay(int(df.x.sum()), df.y)\ndf"


def check_chart(results: list[dict[str, Any]]) -> bytes:
    (figure,) = results
    png = base64.b64decode(figure["image/png"])
    assert png_size(png) == (500, 300)
    assert figure["text/plain"].startswith("<Figure size 500x300")
    return png


def check_frame(results: list[dict[str, Any]]) -> None:
    total, column, frame = results
    assert total["text/plain"] == "6" and not total.get("is_main_result")
    assert "text/html" in column or column["text/plain"].startswith("0    4")
    assert "<table" in frame["text/html"] and frame["is_main_result"] is True
    assert "x  y" in frame["text/plain"]


async def test_charts_and_tables_through_the_python_api(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        with anyio.fail_after(FIRST_CALL_TIMEOUT):
            first = await orch.execute(SETUP, policy="python-data")
        assert first.success, first
        with anyio.fail_after(CALL_TIMEOUT):
            chart = await orch.execute(CHART, session_id=first.session_id)
            check_chart(chart.results)
            frame = await orch.execute(FRAME, session_id=first.session_id)
            check_frame(frame.results)
            # The figure was closed with its cell: the next one starts with none.
            after = await orch.execute("plt.get_fignums()", session_id=first.session_id)
            assert after.result_repr == "[]"


async def test_charts_and_tables_through_mcp(worker_image: ImageBuildResult) -> None:
    with anyio.fail_after(FIRST_CALL_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            first = await client.call_tool(
                "python_repl", {"operation": "execute", "code": SETUP, "policy": "python-data"}
            )
            assert first.structured_content is not None, first
            sid = first.structured_content["session_id"]
            chart = await client.call_tool(
                "python_repl", {"operation": "execute", "session_id": sid, "code": CHART}
            )
            assert chart.structured_content is not None
            png = check_chart(chart.structured_content["results"])
            image = chart.content[1]
            assert image.type == "image" and base64.b64decode(image.data) == png
            frame = await client.call_tool(
                "python_repl", {"operation": "execute", "session_id": sid, "code": FRAME}
            )
            assert frame.structured_content is not None
            check_frame(frame.structured_content["results"])
            await client.call_tool("python_repl", {"operation": "destroy", "session_id": sid})


async def test_charts_and_tables_over_rest(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        app = build_app(orch, KEYS, mcp=False, limits=HttpLimitsConfig())
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://testserver",
            headers={"Authorization": f"Bearer {KEY_A}"},
            timeout=FIRST_CALL_TIMEOUT,
        ) as http:
            created = await http.post("/v1/sessions", json={"code": SETUP, "policy": "python-data"})
            assert created.status_code == 200, created.text
            sid = created.json()["session_id"]
            chart = await http.post(f"/v1/sessions/{sid}/execute", json={"code": CHART})
            check_chart(chart.json()["results"])
            frame = await http.post(f"/v1/sessions/{sid}/execute", json={"code": FRAME})
            check_frame(frame.json()["results"])
            await http.delete(f"/v1/sessions/{sid}")
