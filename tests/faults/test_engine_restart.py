"""The engine is restarted (``dockerd`` stopped, then started) while 20 executes run over 10
sessions: a restart without live-restore stops every container, so every session is lost, and
each says so (``session_lost``, naming the cause), never ``internal`` and never a hang. While the
engine is down ``/readyz`` says ``engine``; once it is back it is ready, new sessions work, and
nothing of the lost sessions is left in the registry, the engine or its networks."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.faults.conftest import FaultCase
from tests.faults.harness import EGRESS_POLICY, Faulted, faulted

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

SESSIONS = 10
CALLS_PER_SESSION = 2
# The cells outlast the restart by far: an answer comes from the fault, never from the cell.
CELL = "import time\ntime.sleep(280)"
CELL_TIMEOUT_S = 290
# Stopping dockerd stops every container (10 s of grace each, in parallel), then it starts again.
RESTART_TIMEOUT = 90.0
# Every call in flight is answered this soon after the engine is back (the engine stopping
# breaks the streams at once; an answer waits at most for one engine call to time out).
ANSWER_TIMEOUT = 60.0
# What an execute caught by the restart may answer: the engine was down when it asked
# (backend_unavailable), its session's container died (session_lost), or its turn never came
# while the other call on the session held it (busy).
IN_FLIGHT_OUTCOMES = {"backend_unavailable", "session_lost", "busy"}


async def _make_sessions(f: Faulted) -> list[str]:
    made = []
    for n in range(SESSIONS):
        policy = {"policy": EGRESS_POLICY} if n < 2 else {}
        body = await f.rest("python_repl", operation="execute", code=f"x = {n}", **policy)
        assert body["success"], body
        made.append(body["session_id"])
    return made


async def _all_busy(f: Faulted, sids: list[str], answers: list[dict[str, Any]]) -> None:
    """Until a call holds every session (the cells are running)."""
    with anyio.fail_after(ANSWER_TIMEOUT):
        while not all(f.orch.find_session(s, tenant="faults").busy for s in sids):
            assert not answers, answers  # a call answered before any fault: a bug of the test
            await anyio.sleep(0.05)


def _registry_rows(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT id FROM sessions")]


async def test_a_restarted_engine_loses_every_session_and_each_says_so(
    engine: FaultCase, tmp_path: Path
) -> None:
    async with faulted(engine, tmp_path) as f:
        sids = await _make_sessions(f)
        # One more, paused when the engine goes: thawing a container the restart stopped.
        # (the orchestrator's own tenant: the REST tenant's quota is full)
        paused = await f.call("python_repl", operation="execute", code="1")
        froze = await f.call("session", operation="pause", session_id=paused["session_id"])
        assert froze["success"], froze
        answers: list[dict[str, Any]] = []

        async def execute(sid: str) -> None:
            code = {"code": CELL, "timeout_s": CELL_TIMEOUT_S}
            timeout = RESTART_TIMEOUT + ANSWER_TIMEOUT
            answer = await f.rest(
                "python_repl", timeout, operation="execute", session_id=sid, **code
            )
            answers.append(answer)

        async with anyio.create_task_group() as tg:
            for sid in sids * CALLS_PER_SESSION:
                tg.start_soon(execute, sid)
            await _all_busy(f, sids, answers)
            with anyio.fail_after(RESTART_TIMEOUT):
                await anyio.to_thread.run_sync(engine.engine.stop)
            status, ready = await f.readyz()
            assert status == 503 and ready["checks"]["engine"] != "ok", ready
            with anyio.fail_after(RESTART_TIMEOUT):
                await anyio.to_thread.run_sync(engine.engine.start)

        assert len(answers) == SESSIONS * CALLS_PER_SESSION
        outcomes = {a["error_type"] for a in answers}
        assert outcomes <= IN_FLIGHT_OUTCOMES, answers
        status, ready = await f.readyz()
        assert status == 200, ready

        thawed = await f.call(
            "python_repl", operation="execute", code="1", session_id=paused["session_id"]
        )
        assert thawed["error_type"] == "session_lost", thawed
        for sid in sids:
            after = await f.rest("python_repl", operation="execute", code="x", session_id=sid)
            assert after["error_type"] == "session_lost", after
            assert "container" in after["error_message"], after
            assert after["_status"] == 410, after

        fresh = await f.rest("python_repl", operation="execute", code="6 * 7")
        assert fresh["success"] and fresh["result_repr"] == "42", fresh
        assert _registry_rows(tmp_path / "registry.db") == [fresh["session_id"]]
        left = engine.leftovers()
        assert len(left["containers"]) == 1 and left["networks"] == [], left
