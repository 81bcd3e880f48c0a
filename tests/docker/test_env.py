"""Environment variables in real sessions, through the tool layer: a session's env (given when it
is made, by ``session create`` or a call without session_id) is seen by its shell, terminals,
background processes and REPL, pooled or cold and after a re-adoption; a command's own env goes
over it for that command only; every refused name or size is answered with its stable
error_type and the session keeps working; the audit log never holds a value."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.audit._log import AuditConfig
from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.images import ImageBuildResult
from orchestrator.policy.env import MAX_ENV_NAME_CHARS, MAX_ENV_VALUE_BYTES, MAX_ENV_VARS
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CALL_TIMEOUT = 60.0
POLL_INTERVAL = 0.1
# Quotes, a dollar, a backslash, a newline and non-ASCII: nothing a shell may expand or split.
TRICKY = 'it\'s "$HOME" \\n `x` é\nsecond line'
SESSION_ENV = {"GREETING": "hello from the session", "TRICKY": TRICKY}
# A value that must never appear in the audit log.
SECRET = "sk-live-7f3a9c1e5b2d4086"


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def call(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        result = await orch.call(tool, args)
    return result.structured


async def ok(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    answer = await call(orch, tool, **args)
    assert answer["success"], answer
    return answer


async def create(orch: Orchestrator, env: dict[str, str], policy: str | None = None) -> str:
    answer = await ok(orch, "session", operation="create", env=env, policy=policy)
    assert answer["created_new_session"]
    return str(answer["session_id"])


async def shell_env(orch: Orchestrator, sid: str, *names: str, **args: Any) -> str:
    answer = await ok(
        orch,
        "terminal",
        operation="run",
        session_id=sid,
        command=f"printenv {' '.join(names)}",
        **args,
    )
    return str(answer["stdout"])


async def terminal_env(orch: Orchestrator, sid: str, name: str, **args: Any) -> str:
    answer = await ok(
        orch,
        "terminal",
        operation="start",
        session_id=sid,
        command=f"printenv {name}",
        use_pty=False,
        **args,
    )
    output, terminal_id = answer["output"], answer["terminal_id"]
    with anyio.fail_after(CALL_TIMEOUT):
        while answer["state"] == "running":
            answer = await ok(
                orch,
                "terminal",
                operation="wait",
                terminal_id=terminal_id,
                since_seq=answer["next_seq"],
            )
            output += answer["output"]
    return str(output)


async def process_env(orch: Orchestrator, sid: str, name: str, **args: Any) -> str:
    started = await ok(
        orch, "process", operation="start", session_id=sid, command=f"printenv {name}", **args
    )
    pid = started["process_id"]
    with anyio.fail_after(CALL_TIMEOUT):
        while True:
            listed = await ok(orch, "process", operation="list", session_id=sid)
            if next(p for p in listed["processes"] if p["process_id"] == pid)["state"] != "running":
                break
            await anyio.sleep(POLL_INTERVAL)
    answer = await ok(orch, "process", operation="read_output", process_id=pid)
    return str(answer["output"])  # its lines, joined by newlines (no final one)


async def repl_env(orch: Orchestrator, sid: str, name: str) -> str:
    code = f"import os\nprint(os.environ.get({name!r}, '<unset>'), end='')"
    answer = await ok(orch, "python_repl", operation="execute", session_id=sid, code=code)
    return str(answer["stdout"])


async def test_a_session_env_is_seen_by_its_shell_terminals_and_background_processes(
    orch: Orchestrator,
) -> None:
    sid = await create(orch, SESSION_ENV)
    assert await shell_env(orch, sid, "GREETING", "TRICKY") == f"hello from the session\n{TRICKY}\n"
    assert await terminal_env(orch, sid, "TRICKY") == f"{TRICKY}\n"
    assert await process_env(orch, sid, "GREETING") == "hello from the session"


async def test_a_command_env_goes_over_the_session_env_for_that_command_only(
    orch: Orchestrator,
) -> None:
    sid = await create(orch, SESSION_ENV)
    over = {"GREETING": "just this once", "EXTRA": TRICKY}
    run = await ok(
        orch,
        "terminal",
        operation="run",
        session_id=sid,
        command="cd /tmp && export KEPT=yes && printenv GREETING EXTRA",
        env=over,
    )
    assert run["stdout"] == f"just this once\n{TRICKY}\n"
    # The shell kept its cd and export; the call's env is gone, the session's is back.
    after = await ok(
        orch,
        "terminal",
        operation="run",
        session_id=sid,
        command='echo "$PWD $KEPT ${EXTRA-unset}"; printenv GREETING',
    )
    assert after["stdout"] == "/tmp yes unset\nhello from the session\n"
    assert await terminal_env(orch, sid, "GREETING", env=over) == "just this once\n"
    assert await terminal_env(orch, sid, "GREETING") == "hello from the session\n"
    assert await process_env(orch, sid, "GREETING", env=over) == "just this once"
    assert await process_env(orch, sid, "GREETING") == "hello from the session"


async def test_a_call_that_creates_its_session_gives_it_session_env(orch: Orchestrator) -> None:
    answer = await ok(
        orch,
        "terminal",
        operation="run",
        command="printenv GREETING ONCE",
        session_env={"GREETING": "new"},
        env={"ONCE": "only here"},
    )
    assert answer["created_new_session"] and answer["stdout"] == "new\nonly here\n"
    sid = answer["session_id"]
    assert await process_env(orch, sid, "GREETING") == "new"
    refused = await call(
        orch, "terminal", operation="run", session_id=sid, command="true", session_env={"A": "1"}
    )
    assert refused["error_type"] == "invalid_argument"


async def test_the_repl_sees_the_session_env_and_a_new_worker_keeps_it(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        sid = await create(orch, SESSION_ENV, policy="unrestricted-python")
        assert await repl_env(orch, sid, "TRICKY") == TRICKY
        await call(orch, "python_repl", operation="reset", session_id=sid)  # a fresh worker
        assert await repl_env(orch, sid, "GREETING") == "hello from the session"
        # A cell's own env is over the session's for that cell only, then it is back.
        code = "import os\nos.environ['GREETING']"
        cell = await call(
            orch,
            "python_repl",
            operation="execute",
            session_id=sid,
            code=code,
            env={"GREETING": "just this cell"},
        )
        assert cell["result_repr"] == repr("just this cell")
        assert await repl_env(orch, sid, "GREETING") == "hello from the session"


async def test_a_pooled_session_gets_the_env_of_the_call_that_takes_it(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        await orch.set_pool_size("default", 1)
        with anyio.fail_after(CALL_TIMEOUT):
            while orch.pool_status()["default"]["ready"] < 1:  # noqa: ASYNC110 (no pool event)
                await anyio.sleep(POLL_INTERVAL)
        pooled = set(await orch.backend.list_containers({LABEL_ORCHESTRATOR: orch.orchestrator_id}))
        sid = await create(orch, SESSION_ENV)
        assert orch.find_session(sid).container_id in pooled
        assert await shell_env(orch, sid, "GREETING") == "hello from the session\n"
        assert await terminal_env(orch, sid, "GREETING") == "hello from the session\n"
        assert await process_env(orch, sid, "GREETING") == "hello from the session"


async def test_a_pooled_sessions_repl_sees_its_env(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:
        await orch.set_pool_size("unrestricted-python", 1)
        with anyio.fail_after(CALL_TIMEOUT):
            while orch.pool_status()["unrestricted-python"]["ready"] < 1:  # noqa: ASYNC110
                await anyio.sleep(POLL_INTERVAL)
        sid = await create(orch, SESSION_ENV, policy="unrestricted-python")
        assert await repl_env(orch, sid, "GREETING") == "hello from the session"


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"LD_PRELOAD": "/workspace/x.so"}, "policy"),
    ({"SANDHOLD_WORKER_CONFIG": "{}"}, "policy"),
    ({"PATH": "/workspace"}, "policy"),
    ({"BASH_ENV": "/workspace/rc"}, "policy"),
    ({"PYTHONPATH": "/workspace"}, "policy"),
    ({"BAD-NAME": "x"}, "invalid_argument"),
    ({"9LIVES": "x"}, "invalid_argument"),
    ({"X" * (MAX_ENV_NAME_CHARS + 1): "x"}, "invalid_argument"),
    ({"NUL": "a\0b"}, "invalid_argument"),
    ({"BIG": "x" * (MAX_ENV_VALUE_BYTES + 1)}, "invalid_argument"),
    ({f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}, "invalid_argument"),
    ({"NUMBER": 7}, "invalid_argument"),
]


async def test_every_refused_env_has_its_error_type_and_the_session_keeps_working(
    orch: Orchestrator,
) -> None:
    ours = {LABEL_ORCHESTRATOR: orch.orchestrator_id}
    for env, error_type in REFUSED:
        refused = await call(orch, "session", operation="create", env=env)
        assert refused["error_type"] == error_type, (env, refused)
    assert await orch.backend.list_containers(ours) == []  # a refused env made nothing
    sid = await create(orch, SESSION_ENV)
    for env, error_type in REFUSED:
        for tool, args in (
            ("terminal", {"operation": "run", "command": "true"}),
            ("terminal", {"operation": "start", "command": "true"}),
            ("process", {"operation": "start", "command": "true"}),
        ):
            refused = await call(orch, tool, session_id=sid, env=env, **args)
            assert refused["error_type"] == error_type, (tool, args, env, refused)
    listed = await ok(orch, "process", operation="list", session_id=sid)
    assert listed["processes"] == []  # nothing was started
    assert await shell_env(orch, sid, "GREETING") == "hello from the session\n"


async def test_the_audit_log_holds_the_names_and_never_a_value(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    settings = config(
        worker_image.tag, audit_dir=tmp_path, audit=AuditConfig(record_arguments=True)
    )
    async with Orchestrator(settings) as orch:
        sid = await create(orch, {"API_TOKEN": SECRET})
        await shell_env(orch, sid, "API_TOKEN", env={"DB_PASSWORD": SECRET})
        await process_env(orch, sid, "API_TOKEN", env={"OTHER": SECRET})
        refused = await call(orch, "session", operation="create", env={"LD_PRELOAD": SECRET})
        assert refused["error_type"] == "policy"
    written = await anyio.to_thread.run_sync(
        lambda: "".join(p.read_text() for p in tmp_path.glob("audit-*.jsonl"))
    )
    assert SECRET not in written
    calls = [json.loads(line) for line in written.splitlines()]
    kept = [c["arguments"] for c in calls if c.get("kind") == "call"]
    assert {"operation": "create", "env": {"API_TOKEN": "***"}, "policy": None} in kept
    assert any(a.get("env") == {"DB_PASSWORD": "***"} for a in kept)


async def test_a_re_adopted_session_still_gives_its_env(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    settings = config(
        worker_image.tag, registry_path=tmp_path / "registry.db", on_shutdown="persist"
    )
    async with Orchestrator(settings) as first:
        sid = await create(first, SESSION_ENV)
        assert await shell_env(first, sid, "GREETING") == "hello from the session\n"
    async with Orchestrator(config(worker_image.tag, **_same(settings))) as second:
        assert sid in {s["session_id"] for s in second.list_sessions()}
        assert await shell_env(second, sid, "GREETING") == "hello from the session\n"
        assert await process_env(second, sid, "TRICKY") == TRICKY


def _same(settings: Any) -> dict[str, Any]:
    """The settings a restart of the same orchestrator has; this one ends its sessions."""
    return {"orchestrator_id": settings.orchestrator_id, "registry_path": settings.registry_path}
