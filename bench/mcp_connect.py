"""``sandhold mcp --connect``: one tool call end to end, as a client that starts a server per call
(langchain-mcp-adapters' ``get_tools()`` and its tools) pays it; prints JSON.

    .venv/bin/python bench/mcp_connect.py [--rounds 20]

One ``sandhold serve`` is started for the run and one session made in it. Each round spawns the
``sandhold`` console script as ``sandhold mcp --connect URL``, sends ``initialize``,
``notifications/initialized`` and one ``tools/call`` (``execute`` of ``x + 1`` in that session),
reads the answer, closes stdin and waits for the process to exit: the time from spawn to exit is
the cost of one call. Beside it, the same call as one POST to the server's ``/mcp`` endpoint on a
kept-alive connection (what the call costs without a process). Target (issue 32): <= 150 ms per
call end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from _stats import summary
from mcp_startup import LABELS, ROUND_TIMEOUT, Lines, serving

TARGET_CALL_MS = 150.0
SANDHOLD_SCRIPT = str(Path(sys.executable).parent / "sandhold")
INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "bench", "version": "0"},
}


async def one_call(argv: list[str], env: dict[str, str], arguments: dict[str, Any]) -> float:
    """Spawn, initialize, one call, EOF, exit: seconds."""
    started = time.perf_counter()
    process = await anyio.open_process(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(ROUND_TIMEOUT):
            lines = Lines(process)
            await lines.request("initialize", INITIALIZE)
            await lines.send("notifications/initialized")
            answer = await lines.request(
                "tools/call", {"name": "python_repl", "arguments": arguments}
            )
            if answer["structuredContent"].get("result_repr") != "42":
                raise RuntimeError(f"execute failed: {answer}")
            assert process.stdin is not None
            await process.stdin.aclose()
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return time.perf_counter() - started


async def over_http(url: str, key: str, arguments: dict[str, Any], rounds: int) -> list[float]:
    """The same call as one POST each to ``/mcp``, on one kept-alive connection."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": INITIALIZE["protocolVersion"],
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "python_repl", "arguments": arguments},
    }
    samples = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=ROUND_TIMEOUT) as http:
        for _ in range(rounds):
            started = time.perf_counter()
            answer = await http.post("/mcp", json=body)
            samples.append(time.perf_counter() - started)
            if '\\"result_repr\\":\\"42\\"' not in answer.text and '"42"' not in answer.text:
                raise RuntimeError(f"execute over /mcp failed: {answer.text[:300]}")
    return samples


async def make_session(url: str, key: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=ROUND_TIMEOUT) as http:
        made = await http.post(
            "/v1/sessions", json={"code": "x = 41"}, headers={"Authorization": f"Bearer {key}"}
        )
    made.raise_for_status()
    return str(made.json()["session_id"])


async def main(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sandhold-bench-connect-") as data:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")},
            "SANDHOLD_DATA_DIR": str(Path(data)),
            "SANDHOLD_EXTRA_LABELS": LABELS,
            "SANDHOLD_ORCHESTRATOR_ID": f"bench-connect-{secrets.token_hex(4)}",
        }
        if "SANDHOLD_IMAGE" in os.environ:
            env["SANDHOLD_IMAGE"] = os.environ["SANDHOLD_IMAGE"]
        async with serving(env) as (url, key):
            session_id = await make_session(url, key)
            arguments = {"operation": "execute", "session_id": session_id, "code": "x + 1"}
            front_env = {k: v for k, v in env.items() if k != "SANDHOLD_ORCHESTRATOR_ID"}
            front_env["SANDHOLD_API_KEY"] = key
            argv = [SANDHOLD_SCRIPT, "mcp", "--connect", url]
            await one_call(argv, front_env, arguments)  # page cache warm, as on a busy host
            per_call = [await one_call(argv, front_env, arguments) for _ in range(rounds)]
            direct = await over_http(url, key, arguments, rounds)
    call = summary(per_call)
    return {
        "connect_call": call,
        "http_mcp_call": summary(direct),
        "target_call_p50_ms": TARGET_CALL_MS,
        "meets_target": call["p50_ms"] <= TARGET_CALL_MS,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    print(json.dumps(anyio.run(main, parser.parse_args().rounds), indent=2))
