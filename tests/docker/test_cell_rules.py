"""IPython's cell rules in the Python worker, against real containers: an indented cell runs,
``IPython.display`` imports where IPython is not installed (its ``display`` is the worker's, and
``raw=True`` takes a MIME bundle as it is), and restricted mode still refuses the import."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CALL_TIMEOUT = 60.0
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def run(orch: Orchestrator, code: str, **arguments: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        answer = await orch.call("python_repl", {"operation": "execute", "code": code, **arguments})
    return answer.structured


async def test_an_indented_cell_runs_as_ipython_runs_it(orch: Orchestrator) -> None:
    ran = await run(orch, "    x = 1\n    if x:\n        print('in')\n    x + 1")
    assert ran["success"] and ran["stdout"] == "in\n" and ran["result_repr"] == "2", ran
    kept = await run(orch, "  s = '''\n  a\n  '''\n  s", session_id=ran["session_id"])
    assert kept["result_repr"] == "'\\na\\n'"


async def test_ipython_display_imports_and_shows_raw_bundles(orch: Orchestrator) -> None:
    ran = await run(
        orch,
        "from IPython.display import display, HTML, Markdown, Image\n"
        "display({'text/plain': 'plain', 'text/html': '<b>bold</b>', 'x/unknown': 1}, raw=True)\n"
        "display({'text/markdown': '# title'}, raw=True)\n"
        "display(HTML('<i>html</i>'), Markdown('*md*'))\n"
        f"display(Image(data={PNG!r}))\n"
        "import IPython\nIPython.display.display is display",
        policy="unrestricted-python",
    )
    assert ran["success"], ran
    bundles = ran["results"]
    assert bundles[0] == {"text/plain": "plain", "text/html": "<b>bold</b>"}
    assert bundles[1] == {"text/plain": "", "text/markdown": "# title"}
    assert bundles[2]["text/html"] == "<i>html</i>" and bundles[3]["text/markdown"] == "*md*"
    assert bundles[4]["image/png"] == PNG
    assert ran["result_repr"] == "True"


async def test_restricted_mode_refuses_the_ipython_module(orch: Orchestrator) -> None:
    refused = await run(orch, "from IPython.display import display")
    assert refused["error_type"] == "import_blocked", refused
