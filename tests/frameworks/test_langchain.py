"""langchain-mcp-adapters with langchain-core, as its README sets it up: ``get_tools()`` on its
defaults, which start a new stdio server for every tool call, pointed at ``sandhold mcp
--connect`` in front of a real ``sandhold serve`` (docs/mcp-clients.md), so sessions outlive each
process; the tools answer with text only, so the model reads every id from the text.

langchain-mcp-adapters 0.3.2 (the newest) requires ``mcp<2``, and sandhold requires
``mcp>=2.3``: they cannot share a virtualenv, so the test extra cannot carry it. The fixture makes
a virtualenv of its own with the pins below (cached in the temp directory, keyed by the pins and
the interpreter), and ``langchain_driver.py`` runs each agent loop in it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.frameworks import scenario
from tests.frameworks.conftest import (
    CLIENT_TIMEOUT,
    SCENARIO_TIMEOUT,
    Served,
    Stdio,
    every_operation,
    every_tool_field,
)
from tests.pinned_venv import pinned_python

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PINS = ("langchain-mcp-adapters==0.3.2", "langchain-core==1.8.1", "mcp==1.30.0")
DRIVER = Path(__file__).with_name("langchain_driver.py")
# Every call is a process of its own (spawn, initialize, forward to serve).
DRIVER_TIMEOUT = 2 * SCENARIO_TIMEOUT


@pytest.fixture(scope="session")
def langchain_python() -> Path:
    """The interpreter of a virtualenv with ``PINS``, made once and kept for later runs."""
    return pinned_python("langchain", PINS)


def connect_front(served: Served, task: str) -> dict[str, Any]:
    """The stdio server the client spawns per call: ``sandhold mcp --connect`` with the key in
    its environment."""
    return {
        "command": sys.executable,
        "args": ["-m", "orchestrator.cli", "mcp", "--connect", served.url, "--task", task],
        "env": {**os.environ, "SANDHOLD_API_KEY": served.key},
    }


async def run(
    python: Path, plan: str, served: Served, task: str, tmp_path: Path, **config: Any
) -> scenario.Script:
    argument = json.dumps({"plan": plan, **connect_front(served, task), **config})  # config wins
    with (tmp_path / "driver.stderr").open("wb") as stderr, anyio.fail_after(DRIVER_TIMEOUT):
        done = await anyio.run_process(
            [str(python), str(DRIVER), argument], stderr=stderr, check=False
        )
    assert done.returncode == 0, (tmp_path / "driver.stderr").read_text()[-4000:]
    answer = json.loads(done.stdout)
    assert answer["final"] == "done" and answer["tools"] == sorted(every_tool_field())
    return scenario.from_transcript_json(answer["transcript"], answer["finished"])


async def test_a_session_outlives_each_per_call_server_and_ids_are_read_from_the_text(
    langchain_python: Path, served: Served, task: str, tmp_path: Path
) -> None:
    script = await run(langchain_python, "kept_session", served, task, tmp_path)
    scenario.check_kept_session(script)
    assert all(isinstance(step.seen, str) for step in script.transcript)


async def test_a_cell_longer_than_the_read_timeout_leaves_the_session_usable(
    langchain_python: Path, served: Served, task: str, tmp_path: Path
) -> None:
    script = await run(
        langchain_python,
        "outlasting_the_client",
        served,
        task,
        tmp_path,
        read_timeout=CLIENT_TIMEOUT,
    )
    scenario.check_outlasting_the_client(script)


async def test_every_operation_takes_null_in_every_field_it_does_not_use(
    langchain_python: Path, served: Served, task: str, tmp_path: Path
) -> None:
    fields = every_tool_field()
    script = await run(
        langchain_python, "every_operation", served, task, tmp_path, fields=fields, plan_task=task
    )
    scenario.check_every_operation(script, task, every_operation())


# Longer than the busy wait (DEFAULT_BUSY_TIMEOUT, 5 s), so the call after the abandoned cell
# hears ``busy`` before the client gives up on it; far shorter than the long cell.
ABANDONING_CLIENT_TIMEOUT = 10.0


@pytest.mark.parametrize("server", ["connect", "local"])
async def test_an_abandoned_cell_is_reported_busy_and_interrupted_and_close_is_clean(
    langchain_python: Path,
    served: Served,
    sandhold_mcp: Stdio,
    task: str,
    tmp_path: Path,
    server: str,
) -> None:
    """mcp 1.x sends no cancel at its timeout (issue 32.2): one persistent session, through
    the ``--connect`` front and through a local ``sandhold mcp``. The driver exits 0 only if
    closing the session with a call in flight raises nothing (no BrokenResourceError)."""
    front = (
        connect_front(served, task)
        if server == "connect"
        else {"command": sandhold_mcp.command, "args": sandhold_mcp.args, "env": sandhold_mcp.env}
    )
    script = await run(
        langchain_python,
        "abandoned_cell",
        served,
        task,
        tmp_path,
        read_timeout=ABANDONING_CLIENT_TIMEOUT,
        persistent=True,
        **front,
    )
    scenario.check_abandoned_cell(script)
