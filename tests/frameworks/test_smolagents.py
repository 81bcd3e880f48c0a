"""smolagents with its MCP client, as its docs set it up: ``MCPClient`` over a real ``sandhold
mcp`` on stdio, and both agent kinds, a ``ToolCallingAgent`` (whose calls smolagents checks
against each tool's inputs before sending them) and a ``CodeAgent`` (whose model writes Python
calling the tools as its prompt shows them). The tools answer with text, so the model reads
every id from the text.

smolagents' MCP client (mcpadapt 0.1.19, the newest for Python 3.11) requires ``mcp<2``, and
sandhold requires ``mcp>=2.3``: they cannot share a virtualenv, so the test extra cannot carry
it. The fixture makes a virtualenv of its own with the pins below (``tests.pinned_venv``), and
``smolagents_driver.py`` runs each agent in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.frameworks import scenario
from tests.frameworks.conftest import Stdio, every_operation, every_tool_field, run_driver
from tests.pinned_venv import pinned_python

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PINS = ("smolagents==1.26.0", "mcpadapt==0.1.19", "mcp==1.30.0")
DRIVER = Path(__file__).with_name("smolagents_driver.py")
KINDS = ("tool_calling", "code")


@pytest.fixture(scope="session")
def smolagents_python() -> Path:
    """The interpreter of a virtualenv with ``PINS``, made once and kept for later runs."""
    return pinned_python("smolagents", PINS)


async def run(
    python: Path, plan: str, kind: str, server: Stdio, tmp_path: Path, **config: Any
) -> tuple[scenario.Script, dict[str, Any]]:
    """One agent run in the driver; the script as it ran and the tools' inputs as smolagents
    made them."""
    stdio = {"command": server.command, "args": server.args, "env": server.env}
    answer = await run_driver(
        python, DRIVER, {"plan": plan, "kind": kind, **stdio, **config}, tmp_path
    )
    assert answer["final"] == "done"
    return scenario.from_transcript_json(answer["transcript"], answer["finished"]), answer["inputs"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_session_is_kept_across_calls_reading_ids_from_the_text(
    smolagents_python: Path, sandhold_mcp: Stdio, tmp_path: Path, kind: str
) -> None:
    script, inputs = await run(smolagents_python, "kept_session", kind, sandhold_mcp, tmp_path)
    scenario.check_kept_session(script)
    assert all(isinstance(step.seen, str) for step in script.transcript)
    # Every argument but operation is optional to smolagents, and takes null.
    for tool, arguments in inputs.items():
        for name, spec in arguments.items():
            optional = name != "operation"
            assert spec.get("nullable", False) is optional, (tool, name, spec)
            assert ("null" in spec["type"]) is optional, (tool, name, spec)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_operation_takes_null_in_every_field_it_does_not_use(
    smolagents_python: Path, sandhold_mcp: Stdio, tmp_path: Path, kind: str
) -> None:
    script, _ = await run(
        smolagents_python,
        "every_operation",
        kind,
        sandhold_mcp,
        tmp_path,
        fields=every_tool_field(),
    )
    scenario.check_every_operation(script, None, every_operation())
