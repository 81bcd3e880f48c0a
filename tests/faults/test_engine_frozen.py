"""The engine freezes (``SIGSTOP`` to ``dockerd``): its API and every stream it relays stall
while the containers run on. Every call that needs it ends within its own deadline with
``backend_unavailable``; ``/healthz`` and the calls that need no engine keep answering; once the
engine is thawed (``SIGCONT``) the live sessions work again with their state."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.session.repl.interpreter import IDLE_PROBE_AFTER, QUICK_OP_TIMEOUT
from tests.faults.conftest import FaultCase
from tests.faults.harness import API_TIMEOUT, Faulted, faulted

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

# How long the engine stays frozen at least (the figure is 30 s; the behaviour is the
# same past the orchestrator's engine-call timeout, which the test sets to 10 s).
FREEZE_S = 12.0
# Each call's deadline: at most two engine calls timing out one after the other (the orchestrator
# under test gives each 10 s), and a margin for a loaded machine. A cell is given no timeout of
# its own: an interrupt the engine took while frozen would be carried out once it is thawed.
MARGIN = 10.0
CALL_DEADLINE = 2 * API_TIMEOUT + MARGIN
# Answers that need no engine come at once.
NO_ENGINE_DEADLINE = 3.0


async def _session_with_state(f: Faulted) -> str:
    first = await f.rest("python_repl", operation="execute", code="x = 41")
    assert first["success"], first
    sid: str = first["session_id"]
    wrote = await f.rest("files", operation="write", session_id=sid, path="kept.txt", content="k")
    assert wrote["success"], wrote
    return sid


def _engine_calls(sid: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("python_repl", {"operation": "execute", "code": "x + 1", "session_id": sid}),
        ("python_repl", {"operation": "execute", "code": "1 + 1"}),
        ("terminal", {"operation": "run", "command": "pwd", "session_id": sid}),
        ("files", {"operation": "read", "session_id": sid, "path": "kept.txt"}),
        ("process", {"operation": "list", "session_id": sid}),
    ]  # fmt: skip


async def test_a_frozen_engine_bounds_every_call_and_the_sessions_come_back_whole(
    engine: FaultCase, tmp_path: Path
) -> None:
    async with faulted(engine, tmp_path) as f:
        sids = [await _session_with_state(f), await _session_with_state(f)]
        answers: list[tuple[str, float, dict[str, Any]]] = []

        async def timed(tool: str, args: dict[str, Any]) -> None:
            started = time.monotonic()
            try:
                answer = await f.rest(tool, CALL_DEADLINE, **args)
            except TimeoutError:
                answer = {"error_type": "no answer", "args": args}
            answers.append((f"{tool}.{args['operation']}", time.monotonic() - started, answer))

        engine.engine.freeze()
        frozen_at = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                for sid in sids:
                    for tool, args in _engine_calls(sid):
                        tg.start_soon(timed, tool, args)
                with anyio.fail_after(NO_ENGINE_DEADLINE):
                    health = await f.http.get("/healthz")
                assert health.status_code == 200, health.text
                listed = await f.rest("python_repl", NO_ENGINE_DEADLINE, operation="list_sessions")
                assert {s["session_id"] for s in listed["sessions"]} == set(sids), listed
                status, ready = await f.readyz()
                assert status == 503 and ready["checks"]["engine"] != "ok", ready
            await anyio.sleep(max(0.0, FREEZE_S - (time.monotonic() - frozen_at)))
        finally:
            engine.engine.thaw()

        assert len(answers) == 2 * len(_engine_calls("-")), answers
        wrong = [(n, t, a) for n, t, a in answers if a["error_type"] != "backend_unavailable"]
        assert wrong == [], wrong

        for sid in sids:
            state = await f.rest("python_repl", operation="execute", code="x", session_id=sid)
            assert state["success"] and state["result_repr"] == "41", state
            kept = await f.rest("files", operation="read", session_id=sid, path="kept.txt")
            assert kept["success"] and kept["content"] == "k", kept
        fresh = await f.rest("python_repl", operation="execute", code="6 * 7")
        assert fresh["success"] and fresh["result_repr"] == "42", fresh


async def test_a_cell_sent_during_a_freeze_shorter_than_the_engines_timeout_keeps_the_state(
    engine: FaultCase, tmp_path: Path
) -> None:
    """The cell's session has been idle, so its worker is pinged first; the ping stalls with the
    engine and times out, the engine is asked and answers once thawed (within its own timeout):
    the worker, whose stream flows again, is kept with its state (it was replaced, the state
    lost, before: seen in 4 sessions over two 15 s freezes of a 10-minute soak)."""
    async with faulted(engine, tmp_path) as f:
        sid = await _session_with_state(f)
        await anyio.sleep(IDLE_PROBE_AFTER + 1.0)
        answers: list[dict[str, Any]] = []

        async def cell() -> None:
            args = {"operation": "execute", "code": "x + 1", "session_id": sid}
            answers.append(await f.rest("python_repl", CALL_DEADLINE + QUICK_OP_TIMEOUT, **args))

        engine.engine.freeze()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cell)
                # Past the worker ping's timeout, short of the engine call's after it.
                await anyio.sleep(QUICK_OP_TIMEOUT + API_TIMEOUT / 2)
                engine.engine.thaw()
        finally:
            if engine.engine.frozen:
                engine.engine.thaw()

        [answer] = answers
        if answer["success"]:
            assert answer["result_repr"] == "42" and not answer.get("state_reset"), answer
        else:
            assert answer["error_type"] == "backend_unavailable", answer
        state = await f.rest("python_repl", operation="execute", code="x", session_id=sid)
        assert state["success"] and state["result_repr"] == "41", state
        assert not state.get("state_reset"), state
