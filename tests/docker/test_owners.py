"""Owners against real containers: a tenant and its tasks see only their own sessions, terminals
and processes (another owner's id answers exactly like an unknown one), grants share listed
actions on a terminal with another task of the same tenant, and ``close_owner`` ends a task."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.backend.base import LABEL_ORCHESTRATOR, LABEL_SESSION
from orchestrator.images import ImageBuildResult
from orchestrator.tools import ToolResult
from tests.conftest import TEST_ORCHESTRATOR_ID
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

Args = dict[str, Any]
Caller = tuple[str, str | None]

TENANT_A = "team-a"
TENANT_B = "team-b"
OWNER: Caller = (TENANT_A, "task-one")
OTHER_TASK: Caller = (TENANT_A, "task-two")
THIRD_TASK: Caller = (TENANT_A, "task-three")
TENANT_A_ITSELF: Caller = (TENANT_A, None)
# Another tenant, as itself and with a task of the very name that owns the session in tenant A.
INTRUDERS: list[Caller] = [(TENANT_B, None), (TENANT_B, "task-one"), OTHER_TASK]
# Every probe is bounded: a hang is a failure, not a stuck suite.
CALL_TIMEOUT = 30.0


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    # An id of its own, so that containers can be counted per orchestrator.
    own_id = f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}"
    async with Orchestrator(config(worker_image.tag, orchestrator_id=own_id)) as orchestrator:
        yield orchestrator


async def call(orch: Orchestrator, caller: Caller, tool: str, args: Args) -> ToolResult:
    tenant, task = caller
    with anyio.fail_after(CALL_TIMEOUT):
        return await orch.call(tool, args, tenant=tenant, task=task)


async def ok(orch: Orchestrator, caller: Caller, tool: str, args: Args) -> dict[str, Any]:
    result = await call(orch, caller, tool, args)
    assert result.structured["success"], (caller, tool, result.structured)
    return result.structured


def shape(result: ToolResult, replacements: dict[str, str]) -> tuple[str, str]:
    """The whole answer, structured and text, with each id replaced by its placeholder."""
    structured = json.dumps(result.structured, sort_keys=True)
    text = result.text
    for item, placeholder in replacements.items():
        structured = structured.replace(item, placeholder)
        text = text.replace(item, placeholder)
    return structured, text


def unknown_ids() -> dict[str, str]:
    """Ids of the same form as real ones that nothing holds."""
    return {
        "session": secrets.token_hex(16),
        "terminal": f"term_{secrets.token_hex(16)}",
        "process": secrets.token_hex(16),
    }


def placeholders(ids: dict[str, str]) -> dict[str, str]:
    return {item: f"<{kind}>" for kind, item in ids.items()}


def probes(ids: dict[str, str]) -> list[tuple[str, Args]]:
    """Every operation that takes a session, terminal or process id; destroy last."""
    sid, tid, pid = ids["session"], ids["terminal"], ids["process"]
    return [
        ("python_repl", {"operation": "execute", "code": "x", "session_id": sid}),
        ("python_repl", {"operation": "reset", "session_id": sid}),
        ("python_repl", {"operation": "history", "session_id": sid}),
        ("python_repl", {"operation": "history_context", "session_id": sid}),
        ("python_repl", {"operation": "inspect", "session_id": sid, "variable_name": "x"}),
        ("python_repl", {"operation": "list_variables", "session_id": sid}),
        ("terminal", {"operation": "start", "command": "true", "session_id": sid}),
        ("terminal", {"operation": "run", "command": "true", "session_id": sid}),
        ("terminal", {"operation": "read", "terminal_id": tid}),
        ("terminal", {"operation": "wait", "terminal_id": tid, "timeout_ms": 10}),
        ("terminal", {"operation": "write", "terminal_id": tid, "input_text": "intruder\n"}),
        ("terminal", {"operation": "interrupt", "terminal_id": tid}),
        ("terminal", {"operation": "kill", "terminal_id": tid}),
        ("terminal", {"operation": "resize", "terminal_id": tid, "rows": 10, "cols": 40}),
        ("process", {"operation": "start", "command": "true", "session_id": sid}),
        ("process", {"operation": "list", "session_id": sid}),
        ("process", {"operation": "read_output", "process_id": pid}),
        ("process", {"operation": "kill", "process_id": pid}),
        ("files", {"operation": "read", "session_id": sid, "path": "secret.txt"}),
        ("files", {"operation": "write", "session_id": sid, "path": "secret.txt", "content": "!"}),
        ("files", {"operation": "list", "session_id": sid}),
        ("files", {"operation": "download", "session_id": sid, "path": "secret.txt"}),
        ("session", {"operation": "pause", "session_id": sid}),
        ("session", {"operation": "resume", "session_id": sid}),
        (
            "session",
            {"operation": "share", "terminal_id": tid, "task": "task-three", "actions": ["read"]},
        ),
        ("python_repl", {"operation": "destroy", "session_id": sid}),
    ]


Shape = tuple[str, str]


async def answers(
    orch: Orchestrator, caller: Caller, tool: str, args: Args, real: dict[str, str]
) -> tuple[Shape, Shape]:
    """The answer to ``args``, which names ``real`` ids, and to the same call on unknown ids,
    each with its ids replaced by placeholders."""
    unknown = {kind: item for kind, item in unknown_ids().items() if kind in real}
    swap = {real[kind]: unknown[kind] for kind in real}
    unknown_args = {k: swap.get(v, v) if isinstance(v, str) else v for k, v in args.items()}
    theirs = await call(orch, caller, tool, args)
    nobody = await call(orch, caller, tool, unknown_args)
    return shape(theirs, placeholders(real)), shape(nobody, placeholders(unknown))


async def assert_answers_like_unknown(
    orch: Orchestrator, caller: Caller, tool: str, args: Args, real: dict[str, str]
) -> None:
    """The same call on unknown ids must answer byte for byte alike (an error, then)."""
    theirs, nobody = await answers(orch, caller, tool, args, real)
    assert theirs == nobody, (caller, tool, args)
    assert '"success": false' in theirs[0], (caller, tool, args)


async def make_session_with_everything(orch: Orchestrator, owner: Caller) -> dict[str, str]:
    """A session of ``owner`` holding a variable, a file, a running terminal and a process."""
    created = await ok(orch, owner, "python_repl", {"operation": "execute", "code": "x = 1"})
    sid = created["session_id"]
    await ok(
        orch,
        owner,
        "files",
        {"operation": "write", "session_id": sid, "path": "secret.txt", "content": "s3cret"},
    )
    started = await ok(
        orch,
        owner,
        "terminal",
        {"operation": "start", "command": "cat", "session_id": sid, "yield_time_ms": 50},
    )
    process = await ok(
        orch, owner, "process", {"operation": "start", "command": "sleep 300", "session_id": sid}
    )
    return {"session": sid, "terminal": started["terminal_id"], "process": process["process_id"]}


async def test_other_tenants_and_other_tasks_get_exactly_the_unknown_answer_everywhere(
    orch: Orchestrator,
) -> None:
    real = await make_session_with_everything(orch, OWNER)
    for caller in INTRUDERS:
        for tool, args in probes(real):
            await assert_answers_like_unknown(orch, caller, tool, args, real)
        listed = await ok(orch, caller, "python_repl", {"operation": "list_sessions"})
        assert listed["count"] == 0 and listed["sessions"] == [], caller
        processes = await ok(orch, caller, "process", {"operation": "list"})
        assert processes["count"] == 0, caller

    # Untouched: the variable, the file, the terminal and the process are as the owner left them.
    sid = real["session"]
    value = await ok(
        orch, OWNER, "python_repl", {"operation": "execute", "code": "x", "session_id": sid}
    )
    assert value["result_repr"] == "1"
    read = await ok(
        orch, OWNER, "files", {"operation": "read", "session_id": sid, "path": "secret.txt"}
    )
    assert read["content"] == "s3cret"
    terminal = await ok(
        orch, OWNER, "terminal", {"operation": "read", "terminal_id": real["terminal"]}
    )
    assert terminal["state"] == "running" and "intruder" not in terminal["output"]
    listing = await ok(orch, OWNER, "process", {"operation": "list", "session_id": sid})
    assert [p["state"] for p in listing["processes"]] == ["running"]

    # The tenant itself, without a task, sees and uses its task's session.
    mine = await ok(orch, TENANT_A_ITSELF, "python_repl", {"operation": "list_sessions"})
    assert [(s["session_id"], s["task"]) for s in mine["sessions"]] == [(sid, "task-one")]
    again = await ok(
        orch,
        TENANT_A_ITSELF,
        "python_repl",
        {"operation": "execute", "code": "x + 1", "session_id": sid},
    )
    assert again["result_repr"] == "2"
    await ok(
        orch, TENANT_A_ITSELF, "terminal", {"operation": "read", "terminal_id": real["terminal"]}
    )

    # close_owner of tenant A's task, by another tenant or another task, is the unknown task's
    # answer; and it ends nothing of tenant A's.
    for caller in [(TENANT_B, None), OTHER_TASK]:
        theirs = await call(
            orch, caller, "session", {"operation": "close_owner", "task": "task-one"}
        )
        nobody = await call(
            orch, caller, "session", {"operation": "close_owner", "task": "task-zzz"}
        )
        assert shape(theirs, {"task-one": "<task>"}) == shape(nobody, {"task-zzz": "<task>"})
        assert not theirs.structured.get("sessions_ended"), theirs.structured
    still = await ok(orch, OWNER, "python_repl", {"operation": "list_sessions"})
    assert still["count"] == 1
    assert len(await orch.backend.list_containers({LABEL_SESSION: sid})) == 1


async def test_a_session_that_ended_stays_unknown_to_other_tasks_and_tenants(
    orch: Orchestrator,
) -> None:
    created = await ok(orch, OWNER, "python_repl", {"operation": "execute", "code": "x = 1"})
    sid = created["session_id"]
    await ok(orch, OWNER, "python_repl", {"operation": "destroy", "session_id": sid})
    real = {"session": sid}
    # Every difference is collected, so that a failure shows all of them at once.
    leaks: list[tuple[Caller, str, str, str]] = []
    for caller in INTRUDERS:
        for tool, args in [
            ("python_repl", {"operation": "execute", "code": "x", "session_id": sid}),
            ("python_repl", {"operation": "history", "session_id": sid}),
            ("files", {"operation": "list", "session_id": sid}),
            ("session", {"operation": "resume", "session_id": sid}),
            ("python_repl", {"operation": "destroy", "session_id": sid}),
        ]:
            theirs, nobody = await answers(orch, caller, tool, args, real)
            if theirs != nobody:
                leaks.append((caller, args["operation"], theirs[0], nobody[0]))
    assert not leaks, "\n".join(f"{c} {op}:\n  {t}\n  {n}" for c, op, t, n in leaks)


async def test_a_grant_shares_exactly_its_actions_with_one_task_of_the_same_tenant(
    orch: Orchestrator,
) -> None:
    started = await ok(
        orch,
        OWNER,
        "terminal",
        {"operation": "start", "command": "cat", "use_pty": False, "yield_time_ms": 50},
    )
    tid = started["terminal_id"]
    real = {"terminal": tid}
    shared = await ok(
        orch,
        OWNER,
        "session",
        {
            "operation": "share",
            "terminal_id": tid,
            "task": "task-two",
            "actions": ["write", "read"],
        },
    )
    assert shared["actions"] == ["read", "write"] and shared["task"] == "task-two"

    # The grantee reads and writes.
    await ok(
        orch,
        OTHER_TASK,
        "terminal",
        {"operation": "write", "terminal_id": tid, "input_text": "hello\n"},
    )
    # The owner waits for the echo (the grantee may not wait); then the grantee reads it.
    with anyio.fail_after(CALL_TIMEOUT):
        output, offset = "", 0
        while "hello" not in output:
            waited = await ok(
                orch,
                OWNER,
                "terminal",
                {"operation": "wait", "terminal_id": tid, "since_offset": offset},
            )
            output, offset = output + waited["output"], waited["next_offset"]
    read = await ok(orch, OTHER_TASK, "terminal", {"operation": "read", "terminal_id": tid})
    assert "hello" in read["output"]

    # ... and nothing else: not granted is not found, as are a re-share and every other owner.
    for tool, args in [
        ("terminal", {"operation": "wait", "terminal_id": tid, "timeout_ms": 10}),
        ("terminal", {"operation": "interrupt", "terminal_id": tid}),
        ("terminal", {"operation": "kill", "terminal_id": tid}),
        (
            "session",
            {"operation": "share", "terminal_id": tid, "task": "task-three", "actions": ["read"]},
        ),
    ]:
        await assert_answers_like_unknown(orch, OTHER_TASK, tool, args, real)
    for caller in [THIRD_TASK, (TENANT_B, "task-two"), (TENANT_B, None)]:
        for tool, args in [
            ("terminal", {"operation": "read", "terminal_id": tid}),
            ("terminal", {"operation": "write", "terminal_id": tid, "input_text": "x\n"}),
        ]:
            await assert_answers_like_unknown(orch, caller, tool, args, real)

    # The tenant is the caller's: a grant cannot name another tenant, nor be made badly.
    bad_shares: list[tuple[Caller, Args]] = [
        (OWNER, {"task": "task-two", "actions": ["read"], "tenant": TENANT_B}),
        (OWNER, {"task": "task-two", "actions": ["kill", "delete"]}),
        (OWNER, {"task": "task-two", "actions": []}),
        (OWNER, {"task": "task-two", "actions": "kill"}),
        (OWNER, {"task": "task-two", "actions": ["kill"] * 6}),
        (OWNER, {"task": "task-two", "actions": [None]}),
        (OWNER, {"task": "task two", "actions": ["kill"]}),
        (OWNER, {"task": "task-one", "actions": ["kill"]}),
        (TENANT_A_ITSELF, {"task": "task-two", "actions": ["kill"]}),
    ]
    for caller, extra in bad_shares:
        refused = await call(
            orch, caller, "session", {"operation": "share", "terminal_id": tid, **extra}
        )
        assert refused.structured["error_type"] == "invalid_argument", (extra, refused.structured)
    # None of them granted anything.
    await assert_answers_like_unknown(
        orch, OTHER_TASK, "terminal", {"operation": "kill", "terminal_id": tid}, real
    )
    await assert_answers_like_unknown(
        orch, (TENANT_B, "task-two"), "terminal", {"operation": "read", "terminal_id": tid}, real
    )
    status = await ok(orch, OWNER, "terminal", {"operation": "read", "terminal_id": tid})
    assert status["state"] == "running"


async def test_close_owner_ends_the_tasks_sessions_and_grants_and_seals_it(
    orch: Orchestrator,
) -> None:
    first = await ok(orch, OWNER, "python_repl", {"operation": "execute", "code": "x = 1"})
    started = await ok(
        orch, OWNER, "terminal", {"operation": "start", "command": "cat", "yield_time_ms": 50}
    )
    owned = {first["session_id"], started["session_id"]}
    assert len(owned) == 2
    tid = started["terminal_id"]
    await ok(
        orch,
        OWNER,
        "session",
        {"operation": "share", "terminal_id": tid, "task": "task-two", "actions": ["read"]},
    )
    await ok(orch, OTHER_TASK, "terminal", {"operation": "read", "terminal_id": tid})
    kept = await ok(orch, OTHER_TASK, "python_repl", {"operation": "execute", "code": "y = 2"})

    # Another task cannot close it: the answer is the unknown task's, and nothing ends.
    theirs = await call(
        orch, OTHER_TASK, "session", {"operation": "close_owner", "task": "task-one"}
    )
    nobody = await call(
        orch, OTHER_TASK, "session", {"operation": "close_owner", "task": "task-zzz"}
    )
    assert theirs.structured["error_type"] == "session_not_found"
    assert shape(theirs, {"task-one": "<task>"}) == shape(nobody, {"task-zzz": "<task>"})
    assert (await ok(orch, OWNER, "python_repl", {"operation": "list_sessions"}))["count"] == 2

    closed = await ok(
        orch, TENANT_A_ITSELF, "session", {"operation": "close_owner", "task": "task-one"}
    )
    assert closed["converged"] is True and closed["sessions_ended"] == 2
    for sid in owned:
        assert await orch.backend.list_containers({LABEL_SESSION: sid}) == [], sid

    # The grant went with the terminal.
    await assert_answers_like_unknown(
        orch, OTHER_TASK, "terminal", {"operation": "read", "terminal_id": tid}, {"terminal": tid}
    )
    # The task is sealed: nothing new, nothing old.
    for tool, args in [
        ("python_repl", {"operation": "execute", "code": "1"}),
        ("terminal", {"operation": "run", "command": "true"}),
        ("python_repl", {"operation": "execute", "code": "1", "session_id": first["session_id"]}),
        ("terminal", {"operation": "read", "terminal_id": tid}),
    ]:
        refused = await call(orch, OWNER, tool, args)
        assert refused.is_error, (tool, args, refused.structured)
    # The other task's own session is untouched, and is the only one left.
    left = await ok(orch, TENANT_A_ITSELF, "python_repl", {"operation": "list_sessions"})
    assert [s["session_id"] for s in left["sessions"]] == [kept["session_id"]]
    value = await ok(
        orch,
        OTHER_TASK,
        "python_repl",
        {"operation": "execute", "code": "y", "session_id": kept["session_id"]},
    )
    assert value["result_repr"] == "2"
    assert len(await orch.backend.list_containers({LABEL_SESSION: kept["session_id"]})) == 1


BAD_TASKS: list[object] = [
    "",
    " ",
    "task one",
    "-task",
    ".task",
    "task/one",
    "../task",
    "task\n",
    "tâche",
    "t" * 129,
    5,
    True,
    ["task-one"],
    {"task": "task-one"},
]


async def test_an_invalid_task_name_is_an_invalid_argument_and_creates_nothing(
    orch: Orchestrator,
) -> None:
    for bad in BAD_TASKS:
        for tool, args in [
            ("python_repl", {"operation": "execute", "code": "1"}),
            ("python_repl", {"operation": "list_sessions"}),
            ("terminal", {"operation": "start", "command": "true"}),
        ]:
            with anyio.fail_after(CALL_TIMEOUT):
                result = await orch.call(tool, args, tenant=TENANT_A, task=bad)
            assert result.structured["error_type"] == "invalid_argument", (bad, tool)
        owner_ops: list[tuple[str, Args]] = [
            ("close_owner", {}),
            ("share", {"terminal_id": "term_x", "actions": ["read"]}),
        ]
        for operation, extra in owner_ops:
            session_args: Args = {"operation": operation, "task": bad, **extra}
            refused = await call(orch, OWNER, "session", session_args)
            assert refused.structured["error_type"] == "invalid_argument", (bad, operation)
    listed = await ok(orch, TENANT_A_ITSELF, "python_repl", {"operation": "list_sessions"})
    assert listed["count"] == 0
    assert await orch.backend.list_containers({LABEL_ORCHESTRATOR: orch.orchestrator_id}) == []


async def test_a_call_in_flight_for_a_task_that_gets_closed_returns_nothing_it_found(
    orch: Orchestrator,
) -> None:
    """Access is checked again when a call's await ends: a task closed meanwhile gets
    session_not_found, never the output its call went on to find."""
    session = await ok(orch, OWNER, "python_repl", {"operation": "execute", "code": "1"})
    start = {
        "operation": "start",
        "session_id": session["session_id"],
        "command": "sleep 1; echo secret; sleep 30",
        "yield_time_ms": 0,
    }
    terminal = await ok(orch, OWNER, "terminal", start)
    wait = {"operation": "wait", "terminal_id": terminal["terminal_id"], "timeout_ms": 20_000}
    answers: list[ToolResult] = []

    async def waiting() -> None:
        answers.append(await call(orch, OWNER, "terminal", wait))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        await anyio.sleep(0.5)
        closed = await ok(
            orch, TENANT_A_ITSELF, "session", {"operation": "close_owner", "task": OWNER[1]}
        )
        assert closed["converged"], closed
    assert answers[0].structured["error_type"] == "session_not_found", answers[0].structured
    assert "secret" not in answers[0].text
