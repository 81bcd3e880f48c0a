"""The tool layer against real containers: one scenario across tools, owners kept apart, and bad
arguments answered with the same ``error_type`` by every operation."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.errors import InvalidArgumentError
from orchestrator.images import ImageBuildResult
from orchestrator.policy.commands import MAX_COMMAND_BYTES
from orchestrator.policy.model import load_policy
from orchestrator.policy_ci.explain import explain_command
from orchestrator.tools import TOOLS
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def ok(
    orch: Orchestrator, tool: str, tenant: str | None = None, **args: Any
) -> dict[str, Any]:
    result = await orch.call(tool, args, tenant=tenant)
    assert result.structured["success"], result.structured
    return result.structured


async def test_a_session_serves_python_files_and_processes_together(orch: Orchestrator) -> None:
    created = await ok(orch, "python_repl", operation="execute", code="1 + 1")
    assert created["created_new_session"] and created["result_repr"] == "2"
    sid = created["session_id"]

    await ok(orch, "files", operation="write", session_id=sid, path="srv/index.html", content="hi")
    started = await ok(
        orch,
        "process",
        operation="start",
        session_id=sid,
        command="python3 -m http.server 8766 --bind 127.0.0.1",
        cwd="srv",
    )
    pid = started["process_id"]
    with anyio.fail_after(30):
        while True:
            listing = await ok(orch, "process", operation="list", session_id=sid)
            ports = [p["ports"] for p in listing["processes"] if p["process_id"] == pid]
            if ports and 8766 in ports[0]:
                break
            await anyio.sleep(0.2)

    read = await ok(orch, "files", operation="read", session_id=sid, path="srv/index.html")
    assert read["content"] == "hi"
    killed = await ok(orch, "process", operation="kill", process_id=pid)
    assert killed["group_empty"]
    await ok(orch, "python_repl", operation="destroy", session_id=sid)
    assert (await ok(orch, "python_repl", operation="list_sessions"))["count"] == 0


def _shape(structured: dict[str, Any], *ids: str) -> dict[str, Any]:
    text = str(structured)
    for item in ids:
        text = text.replace(item, "ID")
    return {"text": re.sub(r"[0-9a-f]{32}", "ID", text)}


async def test_another_tenant_gets_exactly_the_unknown_answer_from_every_operation(
    orch: Orchestrator,
) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="x = 1"))["session_id"]
    pid = (await ok(orch, "process", operation="start", session_id=sid, command="sleep 300"))[
        "process_id"
    ]
    unknown_sid, unknown_pid = "0" * 32, "1" * 32
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        (
            "python_repl",
            {"operation": "execute", "code": "x", "session_id": sid},
            {"session_id": unknown_sid},
        ),
        (
            "python_repl",
            {"operation": "inspect", "session_id": sid, "variable_name": "x"},
            {"session_id": unknown_sid},
        ),
        ("python_repl", {"operation": "destroy", "session_id": sid}, {"session_id": unknown_sid}),
        (
            "files",
            {"operation": "read", "session_id": sid, "path": "a"},
            {"session_id": unknown_sid},
        ),
        ("process", {"operation": "list", "session_id": sid}, {"session_id": unknown_sid}),
        ("process", {"operation": "read_output", "process_id": pid}, {"process_id": unknown_pid}),
        ("process", {"operation": "kill", "process_id": pid}, {"process_id": unknown_pid}),
    ]
    for tool, args, unknown in calls:
        theirs = await orch.call(tool, args, tenant="mallory")
        nobody = await orch.call(tool, {**args, **unknown}, tenant="mallory")
        assert theirs.structured["error_type"] == "session_not_found", (tool, args)
        assert _shape(theirs.structured, sid, pid) == _shape(nobody.structured), (tool, args)
    still = await ok(orch, "python_repl", operation="execute", code="x", session_id=sid)
    assert still["result_repr"] == "1"
    assert (await ok(orch, "process", operation="list", tenant="mallory"))["count"] == 0


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("python_repl", {"operation": "nope"}),
        ("python_repl", {}),
        ("python_repl", {"operation": "execute"}),
        ("python_repl", {"operation": "execute", "code": "1", "timeout_s": "5"}),
        ("python_repl", {"operation": "execute", "code": "1", "surprise": 1}),
        ("python_repl", {"operation": "execute", "code": "1", "policy": "../../etc/passwd"}),
        ("python_repl", {"operation": "execute", "code": "1", "policy": "nosuch"}),
        ("python_repl", {"operation": "history_context", "session_id": "x", "max_tokens": True}),
        ("process", {"operation": "start", "session_id": "x"}),
        ("process", {"operation": "read_output", "process_id": "x", "tail": "10"}),
        ("files", {"operation": "write", "session_id": "x", "path": 3}),
        ("nosuchtool", {"operation": "x"}),
    ],
)
async def test_a_wrong_argument_is_an_invalid_argument_and_creates_nothing(
    orch: Orchestrator, tool: str, args: dict[str, Any]
) -> None:
    result = await orch.call(tool, args)
    assert result.structured["error_type"] == "invalid_argument", result.structured
    assert result.is_error
    assert orch.list_sessions() == []


async def test_policy_rules_apply_to_background_commands(orch: Orchestrator) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="1"))["session_id"]
    denied = await orch.call(
        "process", {"operation": "start", "session_id": sid, "command": "sudo id"}
    )
    assert denied.structured["error_type"] == "policy"
    dangerous = {"operation": "start", "session_id": sid, "command": "rm -rf /workspace/x"}
    assert (await orch.call("process", dangerous)).structured["error_type"] == "policy"
    confirmed = await orch.call("process", {**dangerous, "confirm_dangerous": True})
    assert confirmed.structured["success"]


async def test_binary_files_round_trip_through_the_tool(orch: Orchestrator) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="1"))["session_id"]
    data = bytes(range(256))
    await ok(
        orch,
        "files",
        operation="write",
        session_id=sid,
        path="b.bin",
        content_b64=base64.b64encode(data).decode(),
    )
    read = await ok(orch, "files", operation="read", session_id=sid, path="b.bin")
    assert base64.b64decode(read["content_b64"]) == data


async def test_the_shell_keeps_cwd_and_exports_and_sees_files_from_python(
    orch: Orchestrator,
) -> None:
    first = await ok(orch, "terminal", operation="run", command="mkdir -p proj && cd proj")
    sid = first["session_id"]
    assert first["created_new_session"] and first["cwd"] == "/workspace/proj"
    await ok(orch, "terminal", operation="run", session_id=sid, command="export GREETING=hi")
    echoed = await ok(
        orch, "terminal", operation="run", session_id=sid, command="echo $GREETING; pwd"
    )
    assert echoed["stdout"] == "hi\n/workspace/proj\n" and echoed["exit_code"] == 0
    await ok(
        orch,
        "python_repl",
        operation="execute",
        session_id=sid,
        code="1",
    )
    await ok(orch, "files", operation="write", session_id=sid, path="proj/n.txt", content="7")
    cat = await ok(orch, "terminal", operation="run", session_id=sid, command="cat n.txt")
    assert cat["stdout"] == "7"


async def test_a_pty_program_that_asks_for_input_is_answered_through_write(
    orch: Orchestrator,
) -> None:
    started = await ok(
        orch,
        "terminal",
        operation="start",
        command='read -p "name? " n; echo "hi $n"',
        yield_time_ms=5000,
    )
    tid = started["terminal_id"]
    assert "name?" in started["output"]
    await ok(orch, "terminal", operation="write", terminal_id=tid, input_text="sandhold\n")
    seen = started["output"]
    cursor = started["next_offset"]
    with anyio.fail_after(20):
        while "hi sandhold" not in seen:
            waited = await ok(
                orch,
                "terminal",
                operation="wait",
                terminal_id=tid,
                since_offset=cursor,
                timeout_ms=2000,
            )
            seen += waited["output"]
            cursor = waited["next_offset"]
    other = await orch.call("terminal", {"operation": "read", "terminal_id": tid}, tenant="eve")
    assert other.structured["error_type"] == "session_not_found"


async def test_command_rules_apply_to_terminals_and_the_shell(orch: Orchestrator) -> None:
    denied = await orch.call("terminal", {"operation": "run", "command": "sudo true"})
    assert denied.structured["error_type"] == "policy"
    no_shell = await orch.call(
        "terminal", {"operation": "start", "command": "ls", "policy": "strict"}
    )
    assert no_shell.structured["error_type"] == "policy"
    assert "shell.enabled" in no_shell.structured["error_message"]
    assert orch.list_sessions() == []  # refused before any session was made


def _command_of(size: int) -> str:
    """``true`` and a comment of four-byte characters, exactly ``size`` bytes of UTF-8."""
    head = "true #"
    wide, rest = divmod(size - len(head), 4)
    return head + "\U0001f600" * wide + "x" * rest


async def test_every_command_path_takes_the_same_longest_command(orch: Orchestrator) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="1"))["session_id"]
    longest, over = _command_of(MAX_COMMAND_BYTES), _command_of(MAX_COMMAND_BYTES + 1)
    assert len(longest.encode()) == MAX_COMMAND_BYTES
    paths = [
        ("terminal", {"operation": "start", "session_id": sid, "use_pty": False}),
        ("terminal", {"operation": "run", "session_id": sid}),
        ("process", {"operation": "start", "session_id": sid}),
    ]
    for tool, arguments in paths:
        ran = await ok(orch, tool, **arguments, command=longest)
        assert ran.get("exit_code") in (None, 0), ran
        refused = await orch.call(tool, {**arguments, "command": over})
        assert refused.structured["error_type"] == "invalid_argument", (tool, arguments)
    assert explain_command(load_policy("default"), longest).decision == "allowed"
    with pytest.raises(InvalidArgumentError):
        explain_command(load_policy("default"), over)


FORK_BOMB = (
    "python3 -c 'import os\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError:\n"
    "        pass'"
)


async def test_a_fork_bomb_in_a_terminal_hurts_only_its_own_session(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    (tmp_path / "few-pids.toml").write_text('extends = "default"\n[resources]\npids = 32\n')
    async with Orchestrator(config(worker_image.tag, policy_dirs=(tmp_path,))) as orch:
        bombed = await ok(orch, "terminal", operation="run", command="true", policy="few-pids")
        other = await ok(orch, "python_repl", operation="execute", code="x = 1")
        started = await ok(
            orch,
            "terminal",
            operation="start",
            session_id=bombed["session_id"],
            command=FORK_BOMB,
            use_pty=False,
            yield_time_ms=2000,
        )
        with anyio.fail_after(60):
            for _ in range(5):  # the neighbour answers, again and again, while the bomb runs
                result = await ok(
                    orch,
                    "python_repl",
                    operation="execute",
                    session_id=other["session_id"],
                    code="x += 1\nx",
                )
            shell = await ok(
                orch,
                "terminal",
                operation="run",
                session_id=other["session_id"],
                command="echo fine",
            )
        assert result["result_repr"] == "6" and shell["stdout"] == "fine\n"
        killed = await ok(
            orch, "terminal", operation="kill", terminal_id=started["terminal_id"], signal="KILL"
        )
        assert killed["state"] == "exited"
        with anyio.fail_after(60):
            recovered = await ok(
                orch,
                "terminal",
                operation="run",
                session_id=bombed["session_id"],
                command="echo back",
            )
        assert recovered["stdout"] == "back\n"


def every_field(tool: str, **given: Any) -> dict[str, Any]:
    """The call a client makes that sends every field of the tool's schema (OpenAI strict mode,
    mcp-use): null wherever the operation does not need a value."""
    names = TOOLS[tool].input_schema()["properties"]
    return {**dict.fromkeys(names), **given}


async def test_calls_that_send_every_field_null_where_unused_run_a_whole_session(
    orch: Orchestrator,
) -> None:
    async def strict(tool: str, **given: Any) -> dict[str, Any]:
        result = await orch.call(tool, every_field(tool, **given))
        assert result.structured["success"], (tool, given, result.structured)
        return result.structured

    sid = (await strict("python_repl", operation="execute", code="x = 41"))["session_id"]
    assert (await strict("python_repl", operation="execute", session_id=sid, code="x + 1"))[
        "result_repr"
    ] == "42"
    for operation in ("history", "history_context", "list_variables"):
        await strict("python_repl", operation=operation, session_id=sid)
    await strict("python_repl", operation="inspect", session_id=sid, variable_name="x")
    assert (await strict("python_repl", operation="list_sessions"))["count"] == 1

    env = [{"name": "GREETING", "value": "hi"}]
    shell = await strict("terminal", operation="run", session_id=sid, command="echo ok")
    assert shell["stdout"] == "ok\n"
    started = await strict(
        "terminal", operation="start", session_id=sid, command="echo $GREETING; cat", env=env
    )
    tid = started["terminal_id"]
    await strict("terminal", operation="write", terminal_id=tid, input_text="more\n")
    await strict("terminal", operation="wait", terminal_id=tid)
    await strict("terminal", operation="read", terminal_id=tid)
    await strict("terminal", operation="kill", terminal_id=tid)

    spawned = await strict("process", operation="start", session_id=sid, command="sleep 60")
    await strict("process", operation="list")
    await strict("process", operation="read_output", process_id=spawned["process_id"])
    await strict("process", operation="kill", process_id=spawned["process_id"])

    await strict("files", operation="write", session_id=sid, path="a.txt", content="hi")
    assert (await strict("files", operation="read", session_id=sid, path="a.txt"))[
        "content"
    ] == "hi"
    await strict("files", operation="list", session_id=sid)

    await strict("session", operation="pause", session_id=sid)
    await strict("session", operation="resume", session_id=sid)
    await strict("python_repl", operation="destroy", session_id=sid)
