"""``kill -9`` of ``sandhold serve`` while ~50 calls (REST and MCP) are in flight, then a restart
on the same data directory: every idle session is re-adopted with its state; each session a
call was running in is intact (its variable as before the cell, or as after it) or reported
``session_lost``, never silently reset; the audit log names the calls that had no recorded end.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from orchestrator._core.tenants import LOCAL_KEY_FILE
from orchestrator.backend.base import LABEL_ORCHESTRATOR
from tests.conftest import RUN_ID
from tests.docker.test_serve import STOP_TIMEOUT, running
from tests.faults.conftest import FaultCase

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

# Within the local tenant's default of 10 sessions.
IDLE_SESSIONS = 4
BUSY_SESSIONS = 5
# Per busy session: REST executes, REST shell commands, MCP executes; and new sessions asked
# for over REST (one fits in the tenant's quota): 5 * (3 + 2 + 3) + 10 = 50 calls.
REST_CELLS, SHELL_RUNS, MCP_CELLS, NEW_SESSIONS = 3, 2, 3, 10
IN_FLIGHT = BUSY_SESSIONS * (REST_CELLS + SHELL_RUNS + MCP_CELLS) + NEW_SESSIONS
# The kill comes once this many calls have begun (their call_begin records are written).
BEGUN_BEFORE_KILL = 30
# The cells outlast the kill; after the restart they may have finished or not.
CELL = "import time\ntime.sleep(4)\nx += 1"
CALL_TIMEOUT = 120.0


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


def _clean(case: FaultCase, orchestrator_id: str) -> None:
    client = case.engine.client()
    try:
        label = {"label": f"{LABEL_ORCHESTRATOR}={orchestrator_id}"}
        for container in client.api.containers(all=True, filters=label):
            client.api.remove_container(container["Id"], force=True)
    finally:
        client.close()


async def test_kill_9_under_load_loses_nothing_silently(
    engine: FaultCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, audit = tmp_path / "data", tmp_path / "audit"
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(audit))
    oid = f"test-faults-{RUN_ID}-{secrets.token_hex(4)}"
    try:
        async with running(engine.image, tmp_path, data_dir=data, orchestrator_id=oid) as server:
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
                idle, busy = sids[:IDLE_SESSIONS], sids[IDLE_SESSIONS:]
                answered, unanswered = await _load_then_kill(server, http, key, busy, audit)
        assert answered + unanswered == IN_FLIGHT

        async with running(engine.image, tmp_path, data_dir=data, orchestrator_id=oid) as server:
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=CALL_TIMEOUT
            ) as http:
                for n, sid in enumerate(idle):
                    state = await _rest(
                        http, "python_repl", operation="execute", code="x", session_id=sid
                    )
                    assert state["success"] and state["result_repr"] == str(n), state
                for n, sid in enumerate(busy, start=IDLE_SESSIONS):
                    state = await _rest(
                        http, "python_repl", operation="execute", code="x", session_id=sid
                    )
                    if state["success"]:  # intact: the cells ran or did not, never a fresh x
                        assert int(state["result_repr"]) in range(n, n + REST_CELLS + MCP_CELLS + 1)
                    else:
                        assert state["error_type"] == "session_lost", state
                fresh = await _rest(http, "python_repl", operation="execute", code="6 * 7")
                assert fresh["success"] and fresh["result_repr"] == "42", fresh
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


async def _load_then_kill(
    server: Any, http: httpx.AsyncClient, key: str, busy: list[str], audit: Path
) -> tuple[int, int]:
    """``IN_FLIGHT`` calls, and ``kill -9`` of the server once enough have begun; how many were
    answered and how many were not."""
    answered = unanswered = 0

    async def one(call: Any) -> None:
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

    with contextlib.suppress(Exception):  # the MCP client's own end, once its server is gone
        async with _mcp(server.url, key) as mcp, anyio.create_task_group() as tg:
            tg.start_soon(_calls, one, mcp, http, busy)
            with anyio.fail_after(CALL_TIMEOUT):
                while _begun(audit) < BEGUN_BEFORE_KILL:  # noqa: ASYNC110 (polling a file)
                    await anyio.sleep(0.05)
            server.process.kill()
            with anyio.fail_after(STOP_TIMEOUT):
                await server.process.wait()
    return answered, unanswered


async def _calls(one: Any, mcp: Client, http: httpx.AsyncClient, busy: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        for sid in busy:
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
