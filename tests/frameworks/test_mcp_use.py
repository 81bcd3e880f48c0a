"""mcp-use as its README sets it up: ``MCPClient.from_dict`` with a real ``sandhold mcp`` on
stdio and an ``MCPAgent`` on its defaults, whose LangChain adapter turns each tool's input
schema into a pydantic model (type lists become ``anyOf``) that every call is validated against;
a chat model of our own plays the scripted model, reading the tools' text. mcp-use shows a
failed call (``isError``) as JSON holding our text in ``details``.

mcp-use 1.7.1 (the newest) requires ``mcp<2``, and sandhold requires ``mcp>=2.3``: the fixture
makes a virtualenv of its own with the pins below (``tests.pinned_venv``), and
``mcp_use_driver.py`` runs each agent in it, with mcp-use's telemetry off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.frameworks import scenario
from tests.frameworks.conftest import Stdio, every_operation, every_tool_field, run_driver
from tests.pinned_venv import pinned_python

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PINS = ("mcp-use==1.7.1", "mcp==1.30.0")
DRIVER = Path(__file__).with_name("mcp_use_driver.py")
# mcp-use sends anonymized usage events to a third party unless told not to.
NO_TELEMETRY = {"MCP_USE_ANONYMIZED_TELEMETRY": "false"}


@pytest.fixture(scope="session")
def mcp_use_python() -> Path:
    """The interpreter of a virtualenv with ``PINS``, made once and kept for later runs."""
    return pinned_python("mcp-use", PINS)


async def run(
    python: Path, plan: str, server: Stdio, tmp_path: Path, **config: Any
) -> scenario.Script:
    stdio = {"command": server.command, "args": server.args, "env": {**server.env, **NO_TELEMETRY}}
    answer = await run_driver(python, DRIVER, {"plan": plan, **stdio, **config}, tmp_path)
    assert answer["final"] == "done"
    return scenario.from_transcript_json(answer["transcript"], answer["finished"])


async def test_a_session_is_kept_across_calls_reading_ids_from_the_text(
    mcp_use_python: Path, sandhold_mcp: Stdio, tmp_path: Path
) -> None:
    script = await run(mcp_use_python, "kept_session", sandhold_mcp, tmp_path)
    scenario.check_kept_session(script)
    assert all(isinstance(step.seen, str) for step in script.transcript)


async def test_every_operation_takes_null_in_every_field_it_does_not_use(
    mcp_use_python: Path, sandhold_mcp: Stdio, tmp_path: Path
) -> None:
    script = await run(
        mcp_use_python, "every_operation", sandhold_mcp, tmp_path, fields=every_tool_field()
    )
    scenario.check_every_operation(script, None, every_operation())
