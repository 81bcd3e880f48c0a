"""The typed Sandbox API against the tool call underneath it, in the same run; prints JSON.

    .venv/bin/python bench/sandbox_api.py [--rounds 200] [--creates 5]

- ``run_code_1p1``: ``run_code("1+1")`` in one session: ``Orchestrator.call`` (the baseline),
  ``AsyncSandbox`` in-process, the same REST call made by hand with httpx2 (the remote
  baseline), and ``AsyncSandbox`` remote; the same server, a uvicorn on a loopback socket, for
  both remote rows;
- ``create_to_first_result``: a new session to the answer of its first ``1+1``: the two tool
  calls (``session`` ``create``, then ``execute``) against ``AsyncSandbox.create`` and
  ``run_code``, in-process and remote (no pool: every one is a cold container);
- ``overhead_ms``: each Sandbox p50 minus its baseline's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx2
import uvicorn
from _stats import summary

from orchestrator import AsyncSandbox, Orchestrator, OrchestratorConfig
from orchestrator._core.tenants import TenantConfig, TenantKeys, hash_key, new_key
from orchestrator.http import build_app

LABELS = {"sandhold.bench": "sandbox-api"}
KEY = new_key()
KEYS = TenantKeys([TenantConfig(name="bench", key_sha256=hash_key(KEY))])
CODE = "1+1"


@contextlib.asynccontextmanager
async def serving(orch: Orchestrator) -> AsyncIterator[str]:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets, and without it each
    # kept-alive response waits ~40 ms for the client's delayed ACK (as sandhold serve's own
    # accept loop knows: orchestrator/http/_server.py).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    app = build_app(orch, KEYS, mcp=False)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


async def timed(rounds: int, once: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    await once()  # warm: the first call of a session pays for its setup
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await once()
        samples.append(time.perf_counter() - started)
    return summary(samples)


async def run_code_rows(orch: Orchestrator, url: str, rounds: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    async with AsyncSandbox.create(orchestrator=orch, tenant="bench") as local:
        arguments = {"operation": "execute", "code": CODE, "session_id": local.sandbox_id}

        async def call() -> None:
            assert (await orch.call("python_repl", arguments, tenant="bench")).structured["success"]

        async def sandboxed() -> None:
            assert (await local.run_code(CODE)).text == "2"

        rows["orchestrator_call"] = await timed(rounds, call)
        rows["sandbox_local"] = await timed(rounds, sandboxed)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with (
        AsyncSandbox.create(url=url, api_key=KEY) as remote,
        httpx2.AsyncClient(base_url=url, headers=headers, timeout=60) as http,
    ):
        body = {"operation": "execute", "code": CODE, "session_id": remote.sandbox_id}

        async def rest() -> None:
            assert (await http.post("/v1/python_repl", json=body)).json()["success"]

        async def remote_code() -> None:
            assert (await remote.run_code(CODE)).text == "2"

        rows["rest_by_hand"] = await timed(rounds, rest)
        rows["sandbox_remote"] = await timed(rounds, remote_code)
    return rows


async def create_rows(orch: Orchestrator, url: str, creates: int) -> dict[str, Any]:
    async def calls() -> None:
        made = await orch.call("session", {"operation": "create"}, tenant="bench")
        sid = made.structured["session_id"]
        ran = {"operation": "execute", "code": CODE, "session_id": sid}
        assert (await orch.call("python_repl", ran, tenant="bench")).structured["success"]
        samples.append(time.perf_counter() - started)
        await orch.call("python_repl", {"operation": "destroy", "session_id": sid}, tenant="bench")

    async def sandbox(**where: Any) -> None:
        async with AsyncSandbox.create(**where) as box:
            assert (await box.run_code(CODE)).text == "2"
            samples.append(time.perf_counter() - started)

    rows: dict[str, Any] = {}
    kinds: dict[str, Callable[[], Awaitable[None]]] = {
        "orchestrator_calls": calls,
        "sandbox_local": lambda: sandbox(orchestrator=orch, tenant="bench"),
        "sandbox_remote": lambda: sandbox(url=url, api_key=KEY),
    }
    for name, once in kinds.items():
        samples: list[float] = []
        for _ in range(creates):
            started = time.perf_counter()
            await once()
        rows[name] = summary(samples)
    return rows


async def main(rounds: int, creates: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-sandbox-api", extra_labels=LABELS)
    async with Orchestrator(config) as orch, serving(orch) as url:
        run_code = await run_code_rows(orch, url, rounds)
        created = await create_rows(orch, url, creates)
    p50 = {name: row["p50_ms"] for name, row in run_code.items()}
    figures = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "run_code_1p1": run_code,
        "create_to_first_result": created,
        "overhead_ms": {
            "run_code_local": round(p50["sandbox_local"] - p50["orchestrator_call"], 3),
            "run_code_remote": round(p50["sandbox_remote"] - p50["rest_by_hand"], 3),
            "remote_vs_local": round(p50["sandbox_remote"] - p50["sandbox_local"], 3),
        },
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--creates", type=int, default=5)
    arguments = parser.parse_args()
    anyio.run(main, arguments.rounds, arguments.creates)
