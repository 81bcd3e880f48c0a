"""A cell whose caller went away without a cancel (mcp 1.x clients at their timeout) can be
stopped: ``python_repl interrupt`` does not wait for the session's turn, stops the running cell
with its state kept (or replaces a worker that ignores SIGINT), and the cell is in the history as
``cancelled``; a call that finds the session busy answers ``busy`` naming the running call and
how long it has run, after a bounded wait; a cell whose call is cancelled is in the history too.
Real containers, through ``Orchestrator.call`` as every interface makes it (issue 32.2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Kept short so a refused call answers quickly; the default is DEFAULT_BUSY_TIMEOUT.
BUSY_TIMEOUT = 1.0
# A cell far longer than any wait below: it only ends because it is stopped.
LONG_SLEEP_S = 600
# Container start, the cell's start, the interrupt and the kill grace (default policy: 2 s).
SCENARIO_TIMEOUT = 90.0
STARTED = "started"


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag, busy_timeout=BUSY_TIMEOUT)) as orchestrator:
        yield orchestrator


async def repl(orch: Orchestrator, **arguments: Any) -> dict[str, Any]:
    return (await orch.call("python_repl", arguments)).structured


class Running:
    """A cell run by a call of its own, in the background; ``started`` is set once the cell
    has printed ``STARTED`` (so a SIGINT finds it in the user's code, not before it)."""

    def __init__(self, orch: Orchestrator, session_id: str, code: str) -> None:
        self.orch, self.session_id, self.code = orch, session_id, code
        self.started = anyio.Event()
        self.answer: dict[str, Any] | None = None
        self.scope = anyio.CancelScope()

    def _heard(self, text: str) -> None:
        if STARTED in text:
            self.started.set()

    async def run(self) -> None:
        with self.scope:
            arguments = {"operation": "execute", "session_id": self.session_id, "code": self.code}
            answer = await self.orch.call("python_repl", arguments, on_stdout=self._heard)
            self.answer = answer.structured


def long_cell(before: str) -> str:
    return f"{before}\nprint({STARTED!r}, flush=True)\nimport time\ntime.sleep({LONG_SLEEP_S})"


async def test_interrupt_stops_a_running_cell_at_once_keeping_state_and_history(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = (await repl(orch, operation="execute", code="x = 1"))["session_id"]
        idle = await repl(orch, operation="interrupt", session_id=sid)
        assert idle["success"] and idle["interrupted"] is False and idle["running"] is None

        cell = Running(orch, sid, long_cell("x = 2"))
        async with anyio.create_task_group() as group:
            group.start_soon(cell.run)
            await cell.started.wait()
            busy = await repl(orch, operation="execute", session_id=sid, code="x")
            assert busy["error_type"] == "busy", busy
            assert "python_repl.execute has run for" in busy["error_message"]
            stopped = await repl(orch, operation="interrupt", session_id=sid)
        assert stopped["success"] and stopped["interrupted"] is True, stopped
        assert stopped["running"] == "python_repl.execute" and not stopped["state_reset"]
        assert stopped["ran_for_s"] > 0
        assert cell.answer is not None and cell.answer["error_type"] == "KeyboardInterrupt"

        kept = await repl(orch, operation="execute", session_id=sid, code="x")
        assert kept["result_repr"] == "2" and not kept["state_reset"]
        history = (await repl(orch, operation="history", session_id=sid))["history"]
        assert [entry["outcome"] for entry in history] == ["ok", "cancelled", "ok"]


async def test_a_cell_that_ignores_sigint_is_stopped_by_a_fresh_worker(
    orch: Orchestrator,
) -> None:
    stubborn = (
        f"import time\nprint({STARTED!r}, flush=True)\n"
        "while True:\n    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n        pass"
    )
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = (await repl(orch, operation="execute", code="x = 1"))["session_id"]
        cell = Running(orch, sid, stubborn)
        async with anyio.create_task_group() as group:
            group.start_soon(cell.run)
            await cell.started.wait()
            stopped = await repl(orch, operation="interrupt", session_id=sid)
        assert stopped["interrupted"] is True and stopped["state_reset"] is True, stopped
        assert cell.answer is not None and cell.answer["state_reset"] is True, cell.answer
        after = await repl(orch, operation="execute", session_id=sid, code="1 + 1")
        assert after["result_repr"] == "2"
        outcomes = [
            e["outcome"] for e in (await repl(orch, operation="history", session_id=sid))["history"]
        ]
        assert outcomes[-2:] == ["cancelled", "ok"]


async def test_a_cell_whose_call_is_cancelled_is_in_the_history_as_cancelled(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = (await repl(orch, operation="execute", code="x = 1"))["session_id"]
        cell = Running(orch, sid, long_cell("x = 3"))
        async with anyio.create_task_group() as group:
            group.start_soon(cell.run)
            await cell.started.wait()
            cell.scope.cancel()  # as a client's cancel or a dropped connection does
        assert cell.answer is None
        kept = await repl(orch, operation="execute", session_id=sid, code="x")
        assert kept["result_repr"] == "3" and not kept["state_reset"]
        history = (await repl(orch, operation="history", session_id=sid))["history"]
        assert [(e["code"] == cell.code, e["outcome"]) for e in history] == [
            (False, "ok"),
            (True, "cancelled"),
            (False, "ok"),
        ]
