"""Rich results against real containers, through each interface: the Python API's ``call()``,
the official MCP client over stdio (images as image content beside the structured result), the
REST API and ``sandhold run`` (saved to files). Objects with display hooks stand in for the
libraries here; tests/docker/test_data_template.py has matplotlib and pandas themselves."""

from __future__ import annotations

import base64
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from orchestrator._api import Orchestrator
from orchestrator.http import HttpLimitsConfig, build_app
from orchestrator.images import ImageBuildResult
from tests.docker.test_http_api import KEY_A, KEYS
from tests.docker.test_mcp_stdio import (
    SCENARIO_TIMEOUT,
    new_orchestrator_id,
    server_env,
    stdio_server,
)
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CALL_TIMEOUT = 60


def png(width: int, height: int) -> bytes:
    """A valid grey PNG of the given size, made with the standard library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


CLASSES = f"""
class Chart:
    def _repr_png_(self):
        return {png(32, 20)!r}
    def __repr__(self):
        return "<Chart 32x20>"

class Table:
    def _repr_html_(self):
        return "<table><tr><th>a</th></tr><tr><td>1</td></tr></table>"

class Note:
    def _repr_markdown_(self):
        return "**bold**"

class Huge:
    def _repr_png_(self):
        return b"\\x89PNG" + b"\\0" * 3_000_000
"""
CELL = "display(Chart(), Note())\nTable()"


def check_results(results: list[dict[str, Any]]) -> None:
    chart, note, table = results
    assert png_size(base64.b64decode(chart["image/png"])) == (32, 20)
    assert chart["text/plain"] == "<Chart 32x20>"
    assert note["text/markdown"] == "**bold**" and "text/html" not in note
    assert "<table>" in table["text/html"] and table["is_main_result"] is True
    assert not chart.get("is_main_result") and not note.get("is_main_result")


async def test_rich_results_through_the_python_api(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        with anyio.fail_after(CALL_TIMEOUT):
            first = (
                await orch.call("python_repl", {"operation": "execute", "code": CLASSES})
            ).structured
            sid = first["session_id"]
            run = await orch.call(
                "python_repl", {"operation": "execute", "session_id": sid, "code": CELL}
            )
            check_results(run.structured["results"])
            assert "image/png (" in run.text and "<Chart 32x20>" in run.text
            assert base64.b64encode(png(32, 20)).decode() not in run.text  # named, not repeated

            huge = await orch.call(
                "python_repl",
                {"operation": "execute", "session_id": sid, "code": "display(Huge(), Table())"},
            )
            cut, table = huge.structured["results"]
            assert "image/png" not in cut and cut["truncated"] is True
            assert "<table>" in table["text/html"]
            assert huge.structured["truncated"] is True and huge.structured["success"] is True


async def test_images_are_mcp_image_content_beside_the_structured_result(
    worker_image: ImageBuildResult,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            first = await client.call_tool("python_repl", {"operation": "execute", "code": CLASSES})
            assert first.structured_content is not None
            sid = first.structured_content["session_id"]
            run = await client.call_tool(
                "python_repl", {"operation": "execute", "session_id": sid, "code": CELL}
            )
            assert run.structured_content is not None and not run.is_error
            check_results(run.structured_content["results"])
            kinds = [block.type for block in run.content]
            assert kinds == ["text", "image"]
            image = run.content[1]
            assert image.type == "image" and image.mime_type == "image/png"
            assert png_size(base64.b64decode(image.data)) == (32, 20)
            await client.call_tool("python_repl", {"operation": "destroy", "session_id": sid})


async def test_rich_results_over_rest(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        app = build_app(orch, KEYS, mcp=False, limits=HttpLimitsConfig())
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://testserver",
            headers={"Authorization": f"Bearer {KEY_A}"},
            timeout=CALL_TIMEOUT,
        ) as http:
            created = (await http.post("/v1/sessions", json={"code": CLASSES})).json()
            sid = created["session_id"]
            run = await http.post(f"/v1/sessions/{sid}/execute", json={"code": CELL})
            assert run.status_code == 200, run.text
            check_results(run.json()["results"])


def test_sandhold_run_saves_rich_results_to_files(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    env = server_env(worker_image.tag, new_orchestrator_id())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "--code",
            CLASSES + CELL,
            "--results-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT * 2,
    )
    assert done.returncode == 0, done.stderr
    assert png_size((tmp_path / "result-1.png").read_bytes()) == (32, 20)
    assert (tmp_path / "result-2.md").read_text() == "**bold**"
    assert "<table>" in (tmp_path / "result-3.html").read_text()
    assert f"saved to {tmp_path / 'result-1.png'}" in done.stderr
