"""REPL contexts through the python_repl tool, against real containers: several independent
workers in one session (each its own state and cwd), a bash kernel beside Python, timeouts with
a truthful ``state_reset`` in each, the quota, and a restricted policy refusing other
languages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from orchestrator.session.repl.contexts import MAX_CONTEXTS
from orchestrator.session.repl.interpreter import IDLE_PROBE_AFTER
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

UNRESTRICTED = "unrestricted-python"
CALL_TIMEOUT = 60.0


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def repl(orch: Orchestrator, **arguments: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        return (await orch.call("python_repl", arguments)).structured


async def session(orch: Orchestrator, policy: str = UNRESTRICTED) -> str:
    made = await repl(orch, operation="execute", code="x = 'default'", policy=policy)
    assert made["success"], made
    return str(made["session_id"])


async def test_contexts_keep_their_own_state_and_cwd(orch: Orchestrator) -> None:
    sid = await session(orch)
    made = await repl(orch, operation="create_context", session_id=sid, cwd="/tmp")
    assert made["success"], made
    other = made["context"]["id"]
    assert made["context"] == {"id": other, "language": "python", "cwd": "/tmp"}

    first = await repl(
        orch, operation="execute", session_id=sid, context=other, code="x = 'other'\nx"
    )
    assert first["success"] and first["result_repr"] == "'other'", first
    cwd = await repl(
        orch, operation="execute", session_id=sid, context=other, code="import os\nos.getcwd()"
    )
    assert cwd["result_repr"] == "'/tmp'"
    default = await repl(orch, operation="execute", session_id=sid, code="x")
    assert default["result_repr"] == "'default'"

    listed = await repl(orch, operation="list_contexts", session_id=sid)
    assert [c["id"] for c in listed["contexts"]] == ["default", other]
    history = await repl(orch, operation="history", session_id=sid, context=other)
    assert [e["code"] for e in history["history"]] == ["x = 'other'\nx", "import os\nos.getcwd()"]
    default_history = await repl(orch, operation="history", session_id=sid)
    assert [e["code"] for e in default_history["history"]] == ["x = 'default'", "x"]

    restarted = await repl(orch, operation="restart_context", session_id=sid, context=other)
    assert restarted["success"]
    gone = await repl(orch, operation="execute", session_id=sid, context=other, code="x")
    assert not gone["success"] and gone["error_type"] == "NameError"
    assert (await repl(orch, operation="execute", session_id=sid, code="x"))["success"]

    removed = await repl(orch, operation="remove_context", session_id=sid, context=other)
    assert removed["removed"]
    missing = await repl(orch, operation="execute", session_id=sid, context=other, code="1")
    assert missing["error_type"] == "invalid_argument"
    listed = await repl(orch, operation="list_contexts", session_id=sid)
    assert [c["id"] for c in listed["contexts"]] == ["default"]


async def test_a_bash_context_keeps_variables_cwd_and_reports_errors(orch: Orchestrator) -> None:
    sid = await session(orch)
    made = await repl(orch, operation="create_context", session_id=sid, language="bash")
    ctx = made["context"]["id"]
    assert made["context"]["language"] == "bash"
    first = await repl(
        orch,
        operation="execute",
        session_id=sid,
        context=ctx,
        code="GREETING=hello\ncd /tmp\necho $GREETING; echo oops >&2",
    )
    assert first["success"] and first["stdout"] == "hello\n" and first["stderr"] == "oops\n"
    second = await repl(
        orch,
        operation="execute",
        session_id=sid,
        context=ctx,
        code='echo "$GREETING $(pwd) $ONLY_HERE"',
        env={"ONLY_HERE": "cell"},
    )
    assert second["stdout"] == "hello /tmp cell\n", second
    third = await repl(
        orch, operation="execute", session_id=sid, context=ctx, code='echo "[$ONLY_HERE]"; false'
    )
    assert third["stdout"] == "[]\n"
    assert not third["success"] and third["error_type"] == "ExitCode"
    assert third["error_message"] == "exit status 1"


async def test_a_language_name_is_that_languages_own_context(orch: Orchestrator) -> None:
    sid = await session(orch)
    await repl(orch, operation="execute", session_id=sid, context="bash", code="N=7")
    again = await repl(orch, operation="execute", session_id=sid, context="sh", code="echo $N")
    assert again["stdout"] == "7\n"
    listed = await repl(orch, operation="list_contexts", session_id=sid)
    assert {"id": "bash", "language": "bash", "cwd": None} in listed["contexts"]
    python = await repl(orch, operation="execute", session_id=sid, context="python", code="x")
    assert python["result_repr"] == "'default'"


@pytest.mark.parametrize("language", ["python", "bash"])
async def test_a_timeout_in_a_context_keeps_its_state_or_says_it_was_reset(
    orch: Orchestrator, language: str
) -> None:
    sid = await session(orch)
    ctx = (await repl(orch, operation="create_context", session_id=sid, language=language))[
        "context"
    ]["id"]
    setup, sleep, read = {
        "python": ("k = 5", "import time\ntime.sleep(30)", "k"),
        "bash": ("K=5", "sleep 30", "echo $K"),
    }[language]
    await repl(orch, operation="execute", session_id=sid, context=ctx, code=setup)
    slow = await repl(
        orch, operation="execute", session_id=sid, context=ctx, code=sleep, timeout_s=1
    )
    assert slow["timed_out"] and slow["error_type"] == "timeout"
    assert slow["state_reset"] is False
    kept = await repl(orch, operation="execute", session_id=sid, context=ctx, code=read)
    assert "5" in (kept["result_repr"] or kept["stdout"]) and not kept["state_reset"]

    stubborn = {
        "python": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "time.sleep(30)",
        "bash": "trap '' INT; sleep 30",
    }[language]
    lost = await repl(
        orch, operation="execute", session_id=sid, context=ctx, code=stubborn, timeout_s=1
    )
    assert lost["timed_out"] and lost["state_reset"] is True
    fresh = await repl(orch, operation="execute", session_id=sid, context=ctx, code=read)
    assert "5" not in (fresh["result_repr"] or fresh["stdout"])


async def test_a_session_holds_a_bounded_number_of_contexts(orch: Orchestrator) -> None:
    sid = await session(orch)
    for _ in range(MAX_CONTEXTS):
        made = await repl(orch, operation="create_context", session_id=sid, language="bash")
        assert made["success"], made
    refused = await repl(orch, operation="create_context", session_id=sid, language="bash")
    assert refused["error_type"] == "quota_exceeded" and refused["quota"] == "contexts"


async def test_a_restricted_policy_refuses_other_languages(orch: Orchestrator) -> None:
    sid = await session(orch, policy="default")
    refused = await repl(orch, operation="create_context", session_id=sid, language="bash")
    assert refused["error_type"] == "policy" and refused["rule"] == "python.mode"
    by_name = await repl(orch, operation="execute", session_id=sid, context="bash", code="id")
    assert by_name["error_type"] == "policy"
    python = await repl(orch, operation="create_context", session_id=sid, language="python")
    assert python["success"]
    blocked = await repl(
        orch,
        operation="execute",
        session_id=sid,
        context=python["context"]["id"],
        code="import subprocess",
    )
    assert blocked["error_type"] == "import_blocked"


async def test_bad_context_arguments_are_refused(orch: Orchestrator) -> None:
    sid = await session(orch)
    unknown = await repl(orch, operation="create_context", session_id=sid, language="cobol")
    assert unknown["error_type"] == "invalid_argument"
    no_node = await repl(orch, operation="create_context", session_id=sid, language="js")
    assert no_node["error_type"] == "invalid_argument"
    assert "javascript kernel could not start" in no_node["error_message"]
    relative = await repl(orch, operation="create_context", session_id=sid, cwd="tmp")
    assert relative["error_type"] == "invalid_argument"
    absent = await repl(orch, operation="create_context", session_id=sid, cwd="/no/such/dir")
    assert absent["error_type"] == "invalid_argument"
    default = await repl(orch, operation="remove_context", session_id=sid, context="default")
    assert default["error_type"] == "invalid_argument"
    no_session = await repl(orch, operation="execute", context="bash", code="echo")
    assert no_session["error_type"] == "invalid_argument"


async def test_a_kernel_killed_between_cells_restarts_on_the_next_one(orch: Orchestrator) -> None:
    sid = await session(orch)
    await repl(orch, operation="execute", session_id=sid, context="bash", code="K=1; echo $$")
    pid = await repl(orch, operation="execute", session_id=sid, context="bash", code="echo $PPID")
    killed = await repl(
        orch,
        operation="execute",
        session_id=sid,
        code=f"import os\nos.kill({pid['stdout'].strip()}, 9)",
    )
    assert killed["success"], killed
    fresh = await repl(orch, operation="execute", session_id=sid, context="bash", code="echo [$K]")
    assert fresh["success"] and fresh["state_reset"] is True and fresh["stdout"] == "[]\n", fresh
    after = await repl(orch, operation="execute", session_id=sid, context="bash", code="echo ok")
    assert after["state_reset"] is False


async def test_the_cell_after_an_exit_runs_in_a_fresh_shell(orch: Orchestrator) -> None:
    sid = await session(orch)
    ended = await repl(
        orch, operation="execute", session_id=sid, context="bash", code="K=1; exit 3"
    )
    assert ended["error_type"] == "ExitCode" and not ended["state_reset"]
    fresh = await repl(orch, operation="execute", session_id=sid, context="bash", code="echo [$K]")
    assert fresh["success"] and fresh["state_reset"] is True and fresh["stdout"] == "[]\n", (
        fresh["error_type"],
        fresh["error_message"],
        fresh["state_reset"],
    )


async def test_a_python_worker_killed_while_idle_is_replaced_on_the_next_cell(
    orch: Orchestrator,
) -> None:
    sid = await session(orch)
    pid = (await repl(orch, operation="execute", session_id=sid, code="import os\nos.getpid()"))[
        "result_repr"
    ]
    killed = await repl(
        orch, operation="execute", session_id=sid, context="bash", code=f"kill -9 {pid}"
    )
    assert killed["success"], killed
    # The rule under test is about idle time: a worker is looked at once idle this long.
    await anyio.sleep(IDLE_PROBE_AFTER)
    fresh = await repl(orch, operation="execute", session_id=sid, code="'x' in globals()")
    assert fresh["success"] and fresh["state_reset"] is True, fresh
    assert fresh["result_repr"] == "False"
