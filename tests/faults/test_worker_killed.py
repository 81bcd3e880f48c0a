"""A process sandhold keeps inside a session is killed (``kill -9`` by the sandbox's own user, as
code in the sandbox could; the container's root has no CAP_KILL) while a call uses it: the REPL
worker, the file helper, the persistent shell. The call answers its documented error, the next
call works, and the session is not lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.backend.base import SANDBOX_UID
from tests.faults.conftest import FaultCase
from tests.faults.harness import Faulted, faulted

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

# Kills every process whose command line holds argv[1], but itself; prints how many.
KILLER = (
    "import os, sys\n"
    "n = 0\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        line = open(f'/proc/{p}/cmdline', 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if int(p) != os.getpid() and sys.argv[1].encode() in line:\n"
    "        os.kill(int(p), 9)\n"
    "        n += 1\n"
    "print(n)\n"
)
SANDBOX_USER = str(SANDBOX_UID)
REPL_WORKER = "repl_worker.py"
FILE_HELPER = "fileops.py"
SHELL = "--noediting"  # the persistent shell's own flag: bash --noprofile --norc --noediting -i
# A kill lands within a second on an idle machine; the cell or command outlives it by far.
LONG = 120
ANSWER_TIMEOUT = 60.0


async def _kill(case: FaultCase, container_id: str, pattern: str) -> int:
    def run() -> int:
        client = case.engine.client()
        try:
            result = client.containers.get(container_id).exec_run(
                ["python3", "-c", KILLER, pattern], user=SANDBOX_USER
            )
        finally:
            client.close()
        return int(result.output.decode().strip() or 0)

    return await anyio.to_thread.run_sync(run)


async def _until_killed(case: FaultCase, container_id: str, pattern: str) -> None:
    """Kill ``pattern`` once it runs (a call has just started it, or is about to)."""
    with anyio.fail_after(ANSWER_TIMEOUT):
        while not await _kill(case, container_id, pattern):  # noqa: ASYNC110 (no event to await)
            await anyio.sleep(0.1)


async def _session(f: Faulted) -> tuple[str, str]:
    first = await f.rest("python_repl", operation="execute", code="x = 41")
    assert first["success"], first
    sid: str = first["session_id"]
    wrote = await f.rest("files", operation="write", session_id=sid, path="kept.txt", content="k")
    assert wrote["success"], wrote
    return sid, f.orch.find_session(sid, tenant="faults").container_id


async def _during(
    f: Faulted, case: FaultCase, container_id: str, pattern: str, tool: str, **args: Any
) -> dict[str, Any]:
    """The answer of ``tool`` called with ``args`` while ``pattern`` is killed under it."""
    answers: list[dict[str, Any]] = []

    async def call() -> None:
        answers.append(await f.rest(tool, ANSWER_TIMEOUT + LONG, **args))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await _until_killed(case, container_id, pattern)
    return answers[0]


async def _still_whole(f: Faulted, sid: str) -> None:
    kept = await f.rest("files", operation="read", session_id=sid, path="kept.txt")
    assert kept["success"] and kept["content"] == "k", kept
    shell = await f.rest("terminal", operation="run", session_id=sid, command="echo ok")
    assert shell["success"] and shell["stdout"].strip() == "ok", shell
    listed = await f.rest("python_repl", operation="list_sessions")
    assert sid in {s["session_id"] for s in listed["sessions"]}, listed


async def test_a_killed_repl_worker_is_process_crashed_and_the_next_cell_runs(
    engine: FaultCase, tmp_path: Path
) -> None:
    async with faulted(engine, tmp_path) as f:
        sid, container = await _session(f)
        code = f"import time\ntime.sleep({LONG})"
        answer = await _during(
            f, engine, container, REPL_WORKER, "python_repl",
            operation="execute", session_id=sid, code=code, timeout_s=LONG + 10,
        )  # fmt: skip
        assert answer["error_type"] == "process_crashed", answer
        assert answer["state_reset"] is True, answer
        assert "signal" in answer["error_message"] or "SIGKILL" in answer["error_message"], answer
        after = await f.rest("python_repl", operation="execute", session_id=sid, code="6 * 7")
        assert after["success"] and after["result_repr"] == "42", after
        await _still_whole(f, sid)


async def test_a_killed_shell_ends_its_command_and_the_next_command_gets_a_fresh_shell(
    engine: FaultCase, tmp_path: Path
) -> None:
    async with faulted(engine, tmp_path) as f:
        sid, container = await _session(f)
        answer = await _during(
            f, engine, container, SHELL, "terminal",
            operation="run", session_id=sid, command=f"sleep {LONG}", timeout_s=LONG + 10,
        )  # fmt: skip
        assert answer["success"] is True and answer["exit_code"] != 0, answer
        assert answer["shell_restarted"] is True, answer
        await _still_whole(f, sid)
        state = await f.rest("python_repl", operation="execute", session_id=sid, code="x")
        assert state["success"] and state["result_repr"] == "41", state


async def test_a_killed_file_helper_is_replaced_and_file_calls_keep_working(
    engine: FaultCase, tmp_path: Path
) -> None:
    async with faulted(engine, tmp_path) as f:
        sid, container = await _session(f)
        answers: list[dict[str, Any]] = []

        async def reads() -> None:
            for _ in range(40):
                answers.append(
                    await f.rest("files", operation="read", session_id=sid, path="kept.txt")
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(reads)
            for _ in range(3):
                await _until_killed(case=engine, container_id=container, pattern=FILE_HELPER)
        failed = [a for a in answers if not a["success"]]
        assert all(a["error_type"] == "process_crashed" for a in failed), failed
        await _still_whole(f, sid)
        state = await f.rest("python_repl", operation="execute", session_id=sid, code="x")
        assert state["success"] and state["result_repr"] == "41", state
