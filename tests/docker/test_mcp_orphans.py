"""A killed ``sandhold mcp`` leaks nothing: the next ``sandhold mcp`` on the same data directory
re-adopts its sessions (REPL state included) and a clean stop of that one leaves no container; a
second ``sandhold mcp`` running all along keeps its own session; and with no restart at all, the
containers end themselves once their orphan grace has passed.

The servers are driven with MCP's JSON-RPC lines directly: the test must own the process to
``kill -9`` it (the SDK's stdio client hides it).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest
from anyio.abc import Process

from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CASE_LABEL = "sandhold.test-case"
STARTUP_TIMEOUT = 60.0
CALL_TIMEOUT = 60.0
# A clean stop ends every session it holds (shielded, bounded by the orchestrator).
STOP_TIMEOUT = 60.0
# The watchdog probes every second for a 3 s grace, then its exit stops the container.
ORPHAN_GRACE_S = 3
ORPHAN_END_TIMEOUT = 60.0
SESSIONS = 5


class McpLines:
    """One ``sandhold mcp`` process spoken to in MCP's newline-delimited JSON-RPC."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self._buffer = b""
        self._next_id = 0

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps(message).encode() + b"\n")

    async def _line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            self._buffer += await self.process.stdout.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        await self._send(
            {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        )
        while True:
            message = await self._line()
            if message.get("id") == self._next_id:
                assert "result" in message, message
                result: dict[str, Any] = message["result"]
                return result

    async def initialize(self) -> None:
        await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "sandhold-test", "version": "0"},
            },
        )
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        with anyio.fail_after(CALL_TIMEOUT):
            result = await self.request("tools/call", {"name": tool, "arguments": arguments})
        structured: dict[str, Any] = result["structuredContent"]
        return structured

    async def execute(self, code: str, session_id: str | None = None) -> dict[str, Any]:
        args = {"operation": "execute", "code": code}
        if session_id is not None:
            args["session_id"] = session_id
        answer = await self.call("python_repl", **args)
        assert answer["success"], (answer.get("error_type"), answer.get("error_message"))
        return answer


@asynccontextmanager
async def mcp_server(env: dict[str, str], *args: str) -> AsyncIterator[McpLines]:
    """A running ``sandhold mcp``; on exit its stdin is closed (a clean stop) unless it was
    killed."""
    process = await anyio.open_process(
        [sys.executable, "-m", "orchestrator.cli", "mcp", *args],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        server = McpLines(process)
        with anyio.fail_after(STARTUP_TIMEOUT):
            await server.initialize()
        yield server
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_TIMEOUT):
            if process.returncode is None:
                assert process.stdin is not None
                await process.stdin.aclose()
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def kill_9(server: McpLines) -> None:
    os.kill(server.process.pid, signal.SIGKILL)


def running_containers(case: str) -> list[str]:
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(filters={"label": f"{CASE_LABEL}={case}"})
        return [c["Id"] for c in found]
    finally:
        client.close()


def all_containers(case: str) -> list[str]:
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(all=True, filters={"label": f"{CASE_LABEL}={case}"})
        return [c["Id"] for c in found]
    finally:
        client.close()


@pytest.fixture
def case() -> str:
    return secrets.token_hex(6)


@pytest.fixture
def env(worker_image: ImageBuildResult, tmp_path: Path, case: str) -> dict[str, str]:
    """A fresh HOME (so a fresh data directory) shared by every server of the test."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SANDHOLD_", "XDG_DATA"))}
    return {
        **environ,
        "HOME": str(tmp_path),
        "SANDHOLD_IMAGE": worker_image.tag,
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID},{CASE_LABEL}={case}",
        "SANDHOLD_POOL": "0",  # the containers counted are the sessions the test made
    }


async def test_a_new_mcp_re_adopts_a_killed_ones_sessions_and_a_second_keeps_its_own(
    env: dict[str, str], case: str
) -> None:
    async with mcp_server(env) as other:
        mine = (await other.execute("y = 'other'"))["session_id"]
        async with mcp_server(env) as doomed:
            sessions = [(await doomed.execute(f"x = {i}"))["session_id"] for i in range(SESSIONS)]
            assert len(await anyio.to_thread.run_sync(running_containers, case)) == SESSIONS + 1
            kill_9(doomed)
            await doomed.process.wait()
        assert len(await anyio.to_thread.run_sync(running_containers, case)) == SESSIONS + 1

        async with mcp_server(env) as successor:
            for i, sid in enumerate(sessions):
                answer = await successor.execute("x", session_id=sid)
                assert answer["result_repr"] == str(i), answer
            listed = await successor.call("python_repl", operation="list_sessions")
            assert {s["session_id"] for s in listed["sessions"]} == set(sessions)
        # The successor's clean stop ended what it adopted; the other's session is untouched.
        assert len(await anyio.to_thread.run_sync(running_containers, case)) == 1
        assert (await other.execute("y", session_id=mine))["result_repr"] == "'other'"
    assert await anyio.to_thread.run_sync(all_containers, case) == []
    left = list((Path(env["HOME"]) / ".local/share/sandhold/orchestrators/mcp").iterdir())
    assert left == [], left


async def test_without_any_restart_a_killed_mcps_containers_end_after_their_grace(
    env: dict[str, str], case: str, tmp_path: Path
) -> None:
    policy = tmp_path / "short-grace.toml"
    policy.write_text(f'extends = "default"\n[timeouts]\norphan_grace_s = {ORPHAN_GRACE_S}\n')
    async with mcp_server(env, "--policy", str(policy)) as doomed:
        for _ in range(2):
            await doomed.execute("1 + 1")
        # Attached, the lease is held: the containers outlive their grace. Only time shows it.
        await anyio.sleep(ORPHAN_GRACE_S + 2)
        assert len(await anyio.to_thread.run_sync(running_containers, case)) == 2
        kill_9(doomed)
        await doomed.process.wait()
    try:
        with anyio.fail_after(ORPHAN_END_TIMEOUT):
            # The engine's state is the only signal here; polling it is bounded by the timeout.
            while await anyio.to_thread.run_sync(running_containers, case):  # noqa: ASYNC110
                await anyio.sleep(0.5)
    finally:
        # Stopped, they hold no memory and run nothing; the next sandhold start would remove them
        # (the test above shows that path). Here the test removes what it made.
        await anyio.to_thread.run_sync(remove_all, case)


def remove_all(case: str) -> None:
    client = docker.from_env(timeout=10)
    try:
        for container_id in all_containers(case):
            client.api.remove_container(container_id, force=True)
    finally:
        client.close()
