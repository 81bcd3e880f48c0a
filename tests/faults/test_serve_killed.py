"""``kill -9`` of ``sandhold serve --e2b-port`` while 50 calls (REST, MCP and E2B's SDK) are in
flight, then a restart on the same data directory: every idle session is re-adopted with its
state; each session a call was running in is intact (its variable or file as before the calls,
or as after some of them) or reported lost (``session_lost``; E2B's not-found), never silently
reset; E2B's ``Sandbox.connect`` finds a sandbox made before the kill, every E2B call answers
within its bound; the audit log names the calls that had no recorded end.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import httpx2
import pytest
from anyio.streams.text import TextReceiveStream
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from orchestrator._core.tenants import LOCAL_KEY_FILE
from orchestrator.backend.base import LABEL_ORCHESTRATOR
from tests.conftest import RUN_ID
from tests.docker.test_serve import SERVE, STARTUP_TIMEOUT, STOP_TIMEOUT, serve_env
from tests.faults.conftest import FaultCase

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

# Within a tenant's default of 10 sessions of a policy, with room for the new ones that fit.
IDLE_SESSIONS, BUSY_SESSIONS = 2, 3
IDLE_SANDBOXES, BUSY_SANDBOXES = 1, 2
# Per busy session: REST executes, REST shell commands, MCP executes; per busy sandbox: E2B
# commands and file writes; and new sessions asked for over REST and E2B (one or two fit in the
# quota, the others are refused): 3 * (3 + 2 + 3) + 2 * (4 + 2) + 10 + 4 = 50 calls.
REST_CELLS, SHELL_RUNS, MCP_CELLS = 3, 2, 3
E2B_COMMANDS, E2B_WRITES = 4, 2
NEW_SESSIONS, NEW_SANDBOXES = 10, 4
IN_FLIGHT = (
    BUSY_SESSIONS * (REST_CELLS + SHELL_RUNS + MCP_CELLS)
    + BUSY_SANDBOXES * (E2B_COMMANDS + E2B_WRITES)
    + NEW_SESSIONS
    + NEW_SANDBOXES
)
# The kill comes once this many calls have begun (their call_begin records are written).
BEGUN_BEFORE_KILL = 30
# The cells and commands outlast the kill; after the restart they may have finished or not.
CELL = "import time\ntime.sleep(4)\nx += 1"
COMMAND = "sleep 4; echo x >> count"
CALL_TIMEOUT = 120.0
# The E2B SDK's answers that are the server's (a status it sent), not a broken connection.
E2B_ANSWERS = (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
)


@dataclass
class E2bServe:
    process: anyio.abc.Process
    url: str
    e2b_url: str


@contextlib.asynccontextmanager
async def serving(case: FaultCase, tmp_path: Path, data: Path, oid: str) -> AsyncIterator[E2bServe]:
    """``sandhold serve --e2b-port 0`` on the private engine, its two addresses read from its
    start-up lines; killed if the test leaves it up."""
    env = serve_env(case.image, data, oid)
    with (tmp_path / f"{oid}.stderr").open("ab") as stderr:
        process = await anyio.open_process(
            [*SERVE, "--e2b-port", "0"], env=env, stdout=subprocess.PIPE, stderr=stderr
        )
        try:
            assert process.stdout is not None
            text = ""
            with anyio.fail_after(STARTUP_TIMEOUT):
                async for chunk in TextReceiveStream(process.stdout):
                    text += chunk
                    if "E2B protocol on" in text and text.endswith("\n"):
                        break
            rest = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
            e2b = re.search(r"E2B protocol on (http://127\.0\.0\.1:\d+)", text)
            assert rest and e2b, text
            yield E2bServe(process, rest.group(1), e2b.group(1))
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.move_on_after(STOP_TIMEOUT):
                    await process.wait()


def _begun(audit: Path) -> int:
    return sum(p.read_text().count('"call_begin"') for p in audit.glob("audit-*.jsonl"))


@contextlib.asynccontextmanager
async def _mcp(url: str, key: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=CALL_TIMEOUT) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        yield client


async def _rest(http: httpx.AsyncClient, tool: str, **args: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        response = await http.post(f"/v1/{tool}", json=args)
    body: dict[str, Any] = response.json()
    return body


def _e2b_options(server: E2bServe, key: str) -> dict[str, Any]:
    """The SDK's own options, pointed at this server; no retries, so each call is one try."""
    return {"api_key": key, "api_url": server.e2b_url, "sandbox_url": server.e2b_url,
            "request_timeout": CALL_TIMEOUT, "retries": 0}  # fmt: skip


async def _e2b_answered(call: Callable[[], Awaitable[Any]]) -> None:
    """An E2B call whose refusal by the server (an exception the SDK made of its status) counts
    as an answer; a broken connection raises on."""
    with contextlib.suppress(*E2B_ANSWERS):
        await call()


def _clean(case: FaultCase, orchestrator_id: str) -> None:
    client = case.engine.client()
    try:
        label = {"label": f"{LABEL_ORCHESTRATOR}={orchestrator_id}"}
        for container in client.api.containers(all=True, filters=label):
            client.api.remove_container(container["Id"], force=True)
    finally:
        client.close()


@pytest.mark.timeout(600)
async def test_kill_9_under_load_loses_nothing_silently(
    engine: FaultCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, audit = tmp_path / "data", tmp_path / "audit"
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(audit))
    oid = f"test-faults-{RUN_ID}-{secrets.token_hex(4)}"
    try:
        async with serving(engine, tmp_path, data, oid) as server:
            key = (data / LOCAL_KEY_FILE).read_text().strip()
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=CALL_TIMEOUT
            ) as http:
                sids = []
                for n in range(IDLE_SESSIONS + BUSY_SESSIONS):
                    made = await _rest(http, "python_repl", operation="execute", code=f"x = {n}")
                    assert made["success"], made
                    sids.append(made["session_id"])
                sandboxes = []
                for n in range(IDLE_SANDBOXES + BUSY_SANDBOXES):
                    with anyio.fail_after(CALL_TIMEOUT):
                        sandbox = await AsyncSandbox.create(
                            timeout=900, **_e2b_options(server, key)
                        )
                        await sandbox.commands.run(f"echo e2b-{n} > state")
                    sandboxes.append(sandbox)
                busy = sids[IDLE_SESSIONS:], sandboxes[IDLE_SANDBOXES:]
                answered, unanswered = await _load_then_kill(server, http, key, busy, audit)
        assert answered + unanswered == IN_FLIGHT

        async with serving(engine, tmp_path, data, oid) as server:
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=CALL_TIMEOUT
            ) as http:
                await _rest_sessions_after(http, sids)
                await _sandboxes_after(server, key, [s.sandbox_id for s in sandboxes])
                for sid in sids[:IDLE_SESSIONS]:  # room in the quota for a new one
                    await _rest(http, "python_repl", operation="destroy", session_id=sid)
                fresh = await _rest(http, "python_repl", operation="execute", code="6 * 7")
                assert fresh["success"] and fresh["result_repr"] == "42", fresh
                with anyio.fail_after(CALL_TIMEOUT):
                    new = await AsyncSandbox.create(**_e2b_options(server, key))
                    ran = await new.commands.run("echo new")
                    await new.kill()
                assert ran.stdout == "new\n"
            server.process.terminate()
            with anyio.fail_after(STOP_TIMEOUT):
                await server.process.wait()
    finally:
        await anyio.to_thread.run_sync(_clean, engine, oid)

    with anyio.fail_after(CALL_TIMEOUT):
        verified = await anyio.run_process(
            [sys.executable, "-m", "orchestrator.cli", "audit", "verify", str(audit)], check=False
        )
    out = verified.stdout.decode()
    assert verified.returncode == 0, out
    found = re.search(r"(\d+) call\(s\) begun with no recorded end", out)
    assert found, out
    assert 1 <= int(found.group(1)) <= unanswered, (out, unanswered)


async def _rest_sessions_after(http: httpx.AsyncClient, sids: list[str]) -> None:
    """Idle sessions have their variable; busy ones have it as before or after their cells, or
    say ``session_lost``."""
    for n, sid in enumerate(sids):
        state = await _rest(http, "python_repl", operation="execute", code="x", session_id=sid)
        if n < IDLE_SESSIONS:
            assert state["success"] and state["result_repr"] == str(n), state
        elif state["success"]:  # intact: the cells ran or did not, never a fresh x
            assert int(state["result_repr"]) in range(n, n + REST_CELLS + MCP_CELLS + 1), state
        else:
            assert state["error_type"] == "session_lost", state


async def _sandboxes_after(server: E2bServe, key: str, ids: list[str]) -> None:
    """Each sandbox made before the kill, through E2B's SDK (its id is kept in the registry):
    an idle one is found with its file; a busy one with its file and as many lines as commands
    ran (none to all), or not found (lost with its session); every call bounded."""
    for n, sandbox_id in enumerate(ids):
        with anyio.fail_after(CALL_TIMEOUT):
            try:
                sandbox = await AsyncSandbox.connect(sandbox_id, **_e2b_options(server, key))
            except NotFoundException:
                assert n >= IDLE_SANDBOXES, f"idle sandbox {sandbox_id} not found after restart"
                continue  # lost with its session, and said so
            seen = await sandbox.commands.run("cat state; cat count 2>/dev/null | wc -l")
        state, lines = seen.stdout.split()
        assert state == f"e2b-{n}", (sandbox_id, seen.stdout)  # never a fresh filesystem
        assert int(lines) in range(E2B_COMMANDS + 1 if n >= IDLE_SANDBOXES else 1), seen.stdout


async def _load_then_kill(
    server: E2bServe,
    http: httpx.AsyncClient,
    key: str,
    busy: tuple[list[str], list[AsyncSandbox]],
    audit: Path,
) -> tuple[int, int]:
    """``IN_FLIGHT`` calls, and ``kill -9`` of the server once enough have begun; how many were
    answered and how many were not."""
    answered = unanswered = 0

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        nonlocal answered, unanswered
        done = False
        try:
            with anyio.fail_after(CALL_TIMEOUT):
                await call()
            done = True
        except Exception:  # the server died under it: any transport error, as a client sees it
            pass
        finally:  # cancelled too: the MCP client's session ends with the server
            answered, unanswered = answered + done, unanswered + (not done)

    sessions, sandboxes = busy
    # E2B's calls are left to end by themselves (the kill breaks their connections): one cancelled
    # mid-stream, as the MCP client's end cancels its group, leaves an exception in a task of the
    # SDK's transport that nobody retrieves.
    async with anyio.create_task_group() as e2b_group:
        _e2b_calls(e2b_group, one, sandboxes, _e2b_options(server, key))
        with contextlib.suppress(Exception):  # the MCP client's own end, once its server is gone
            async with _mcp(server.url, key) as mcp, anyio.create_task_group() as tg:
                tg.start_soon(_calls, one, mcp, http, sessions)
                with anyio.fail_after(CALL_TIMEOUT):
                    while _begun(audit) < BEGUN_BEFORE_KILL:  # noqa: ASYNC110 (polling a file)
                        await anyio.sleep(0.05)
                server.process.kill()
                with anyio.fail_after(STOP_TIMEOUT):
                    await server.process.wait()
    return answered, unanswered


Call = Callable[[Callable[[], Awaitable[Any]]], Awaitable[None]]


async def _calls(one: Call, mcp: Client, http: httpx.AsyncClient, sessions: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        for sid in sessions:
            cell = {"operation": "execute", "session_id": sid, "code": CELL}
            for _ in range(REST_CELLS):
                tg.start_soon(one, lambda c=cell: _rest(http, "python_repl", **c))
            shell = {"operation": "run", "session_id": sid, "command": "sleep 4"}
            for _ in range(SHELL_RUNS):
                tg.start_soon(one, lambda c=shell: _rest(http, "terminal", **c))
            for _ in range(MCP_CELLS):
                tg.start_soon(one, lambda c=cell: mcp.call_tool("python_repl", c))
        for _ in range(NEW_SESSIONS):
            new = {"operation": "execute", "code": "y = 1"}
            tg.start_soon(one, lambda c=new: _rest(http, "python_repl", **c))


def _e2b_calls(
    tg: anyio.abc.TaskGroup, one: Call, sandboxes: list[AsyncSandbox], e2b: dict[str, Any]
) -> None:
    for sandbox in sandboxes:
        for _ in range(E2B_COMMANDS):
            run = sandbox.commands.run
            tg.start_soon(one, lambda r=run: _e2b_answered(lambda: r(COMMAND)))
        for n in range(E2B_WRITES):
            write = sandbox.files.write
            tg.start_soon(one, lambda w=write, n=n: _e2b_answered(lambda: w(f"w{n}", "w")))
    for _ in range(NEW_SANDBOXES):
        tg.start_soon(one, lambda: _e2b_answered(lambda: AsyncSandbox.create(**e2b)))
