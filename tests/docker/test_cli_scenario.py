"""The issue's scenario through the CLI alone: ``sandhold serve --pool 1`` as a subprocess, then
only ``sandhold call`` (and ``sandhold shell --server``) against it: a session taken from the warm
pool, execute, a shell command, a background process, a file, destroy; a wrong argument is
``invalid_argument`` with exit status 2 as over MCP and HTTP; SIGTERM leaves no container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest

from orchestrator.backend.base import LABEL_ORCHESTRATOR, LABEL_SESSION
from orchestrator.images import ImageBuildResult
from tests.docker.test_serve import STOP_TIMEOUT, Server, running

# One CLI process: the interpreter's imports (~1 s) and one call, a new session at most.
CALL_TIMEOUT = 60
SANDHOLD = [sys.executable, "-m", "orchestrator.cli"]


def sandhold(
    server: Server, data_dir: Path, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``sandhold ARGS --server URL``, its key found in the data directory as a person's would
    be."""
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(data_dir)}
    env.pop("SANDHOLD_API_KEY", None)
    return subprocess.run(
        [*SANDHOLD, *args, "--server", server.url],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
    )


class Cli:
    def __init__(self, server: Server, data_dir: Path) -> None:
        self.server = server
        self.data_dir = data_dir

    async def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return await anyio.to_thread.run_sync(
            lambda: sandhold(self.server, self.data_dir, *args, stdin=stdin)
        )

    async def call(self, tool: str, **arguments: Any) -> tuple[int, dict[str, Any]]:
        done = await self.run("call", tool, json.dumps(arguments), "--json")
        assert done.stdout, done.stderr
        return done.returncode, json.loads(done.stdout)

    async def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        status, result = await self.call(tool, **arguments)
        assert status == 0 and result["success"], result
        return result


def sessions_of(orchestrator_id: str) -> list[str]:
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(
            all=True, filters={"label": f"{LABEL_ORCHESTRATOR}={orchestrator_id}"}
        )
        return [c["Labels"][LABEL_SESSION] for c in found]
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.anyio
async def test_the_scenario_through_sandhold_call_uses_the_served_pool_and_leaves_nothing(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path, "--pool", "1") as server:
        # Serving began once the pool was full: its one session is the first a call gets.
        pooled = await anyio.to_thread.run_sync(sessions_of, server.orchestrator_id)
        assert len(pooled) == 1
        cli = Cli(server, tmp_path / "data")

        created = await cli.ok("python_repl", operation="execute", code="x = 6 * 7\nx")
        assert created["created_new_session"] and created["result_repr"] == "42"
        sid = created["session_id"]
        assert sid == pooled[0]
        again = await cli.ok("python_repl", operation="execute", session_id=sid, code="print(x+1)")
        assert again["stdout"] == "43\n" and not again["created_new_session"]

        shell = await cli.ok("terminal", operation="run", session_id=sid, command="echo hi; pwd")
        assert shell["stdout"] == "hi\n/workspace\n" and shell["exit_code"] == 0

        started = await cli.ok("process", operation="start", session_id=sid, command="sleep 300")
        listing = await cli.ok("process", operation="list", session_id=sid)
        listed = {p["process_id"]: p for p in listing["processes"]}
        assert listed[started["process_id"]]["state"] == "running"

        await cli.ok("files", operation="write", session_id=sid, path="notes/a.txt", content="hi")
        read = await cli.ok("files", operation="read", session_id=sid, path="notes/a.txt")
        assert read["content"] == "hi"

        await cli.ok("python_repl", operation="destroy", session_id=sid)
        assert (await cli.ok("python_repl", operation="list_sessions"))["count"] == 0

        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM
        assert await anyio.to_thread.run_sync(sessions_of, server.orchestrator_id) == []


WRONG_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("python_repl", {"operation": "execute", "code": "1", "timeout_s": "5"}),
    ("python_repl", {"operation": "nope"}),
    ("files", {"operation": "read", "session_id": "x", "path": "a", "surprise": 1}),
    ("nosuchtool", {"operation": "execute"}),
]


@pytest.mark.docker
@pytest.mark.anyio
async def test_sandhold_call_answers_by_exit_status_and_shell_runs_against_the_server(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        cli = Cli(server, tmp_path / "data")
        # The same error_type as over MCP and HTTP, always exit status 2 with the one-line error.
        for tool, arguments in WRONG_ARGUMENTS:
            status, result = await cli.call(tool, **arguments)
            assert status == 2 and result["error_type"] == "invalid_argument", result
        plain = await cli.run("call", "python_repl", '{"operation": "nope"}')
        assert plain.returncode == 2 and plain.stdout == ""
        assert plain.stderr.startswith("error: invalid_argument: ")
        unparsed = await cli.run("call", "python_repl", "{")
        assert unparsed.returncode == 2 and unparsed.stderr.startswith("error: invalid_argument:")

        # A failure of the user's code is the tool's answer: exit status 1, shown readably.
        failed = await cli.run(
            "call", "python_repl", "-", stdin='{"operation": "execute", "code": "1/0"}'
        )
        assert failed.returncode == 1, failed.stderr
        assert "python_repl.execute: ZeroDivisionError" in failed.stdout
        assert "Traceback" in failed.stdout

        shell = await cli.run("shell", stdin="echo $((6*7))\nexit 3\n")
        assert shell.returncode == 3, shell.stderr
        assert "$ 42\n" in shell.stdout

        listing = await cli.ok("python_repl", operation="list_sessions")
        assert listing["count"] == 1  # the failed execute's; the shell removed its own
        await cli.ok(
            "python_repl", operation="destroy", session_id=listing["sessions"][0]["session_id"]
        )

        denied = await cli.run(
            "call", "python_repl", '{"operation": "list_sessions"}', "--key", "sandhold_" + "x" * 40
        )
        assert denied.returncode == 2 and denied.stderr.startswith("error: unauthenticated: ")
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            assert await server.process.wait() == 128 + signal.SIGTERM
        assert await anyio.to_thread.run_sync(sessions_of, server.orchestrator_id) == []


def test_sandhold_call_without_a_server_is_backend_unavailable(tmp_path: Path) -> None:
    env = {**os.environ, "SANDHOLD_API_KEY": "sandhold_" + "k" * 40}
    done = subprocess.run(
        [
            *SANDHOLD,
            "call",
            "python_repl",
            '{"operation": "list_sessions"}',
            "--server",
            "http://127.0.0.1:9",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: backend_unavailable: cannot reach sandhold at http://127.0.0.1:9"
    )
