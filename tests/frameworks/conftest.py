"""What the framework tests share: a real ``sandhold mcp`` command line for stdio clients, one real
``sandhold serve`` per module for HTTP clients (module-scoped, so the event loop is too), a task
name per test, and the operations every tool has.

The scripted model is in ``scenario``; each test module wraps it in its framework's test model.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.images import ImageBuildResult
from orchestrator.tools import TOOLS
from tests.docker.test_mcp_stdio import new_orchestrator_id, server_env
from tests.docker.test_serve import STOP_TIMEOUT, running
from tests.frameworks import scenario

# A scenario's calls: a container and a ready worker for the first, a cell, a loaded machine.
SCENARIO_TIMEOUT = 120.0
# A driver in its own virtualenv starts its interpreter, its framework and a server first.
DRIVER_TIMEOUT = 2 * SCENARIO_TIMEOUT
# A client that gives up on a call sooner than the long cell ends, where the framework lets a
# timeout be set; long enough that no other call of the scenarios comes near it.
CLIENT_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module-scoped, so that one ``sandhold serve`` serves a whole module."""
    return "asyncio"


@dataclass(frozen=True)
class Stdio:
    """``sandhold mcp`` as a client spawns it."""

    command: str
    args: list[str]
    env: dict[str, str]


@pytest.fixture
def sandhold_mcp(worker_image: ImageBuildResult) -> Stdio:
    env = server_env(worker_image.tag, new_orchestrator_id())
    return Stdio(sys.executable, ["-m", "orchestrator.cli", "mcp"], env)


@dataclass(frozen=True)
class Served:
    url: str
    key: str

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    def headers(self, task: str | None = None) -> dict[str, str]:
        task_header = {"X-Sandhold-Task": task} if task else {}
        return {"Authorization": f"Bearer {self.key}", **task_header}


@pytest.fixture(scope="module")
async def served(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    """One ``sandhold serve`` for the module, stopped as a person stops it (its sessions end)."""
    tmp_path: Path = tmp_path_factory.mktemp("serve")
    async with running(worker_image.tag, tmp_path) as server:
        yield Served(server.url, server.notice.rsplit(": ", 1)[1])
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM


@pytest.fixture
def task() -> str:
    """A task of its own per test: ``close_owner`` seals the task it closes."""
    return f"framework-{secrets.token_hex(4)}"


def every_tool_field() -> dict[str, list[str]]:
    return {
        name: sorted(set(tool.input_schema()["properties"]) - {"operation"})
        for name, tool in TOOLS.items()
    }


def every_operation() -> set[tuple[str, str]]:
    """Every operation a framework's scenario calls: all but those that commit a container
    (``scenario.COMMITTING``: seconds each, times seven stacks), whose arguments are plain
    strings that ``snapshots`` and ``create`` already carry through every stack; the official
    client calls them in tests/docker/test_snapshots.py."""
    everything = {(name, op) for name, tool in TOOLS.items() for op in tool.operations}
    return everything - scenario.COMMITTING


async def drive(
    script: scenario.Script, call_tool: Callable[[scenario.Call], Awaitable[scenario.Seen]]
) -> None:
    """A plain client's agent loop: each call of the script made with ``call_tool``; what the
    client raises is shown to the model as text, as an agent loop shows a failed tool."""
    with anyio.fail_after(SCENARIO_TIMEOUT):
        call = script.start()
        while call is not None:
            try:
                seen = await call_tool(call)
            except Exception as exc:  # what the client raised is the answer the model sees
                seen = f"the tool call raised {type(exc).__name__}: {exc}"
            call = script.step(seen)


async def run_driver(
    python: Path, driver: Path, config: dict[str, Any], tmp_path: Path
) -> dict[str, Any]:
    """Run ``driver`` (a framework's agent loop, in that framework's pinned virtualenv) with
    ``config`` as its JSON argument; its JSON answer. Its stderr is kept in ``tmp_path`` and
    shown when it fails."""
    stderr_path = tmp_path / f"{driver.stem}.stderr"
    with stderr_path.open("wb") as stderr, anyio.fail_after(DRIVER_TIMEOUT):
        done = await anyio.run_process(
            [str(python), str(driver), json.dumps(config)], stderr=stderr, check=False
        )
    assert done.returncode == 0, stderr_path.read_text()[-4000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
