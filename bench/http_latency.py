"""One execute over every interface a client reaches by the network or a pipe; prints JSON.

    .venv/bin/python bench/http_latency.py [--rounds 300]

Measured in one run, each against a server started for it as a user starts it (``sandhold serve``,
``sandhold mcp``), on a kept-alive connection, after a warm-up:
- ``rest_execute``: ``POST /v1/sessions/{id}/execute`` with ``{"code": "1+1"}`` (httpx);
- ``mcp_http_execute``: ``python_repl`` ``execute`` through the official MCP client's streamable
  HTTP transport against ``/mcp`` of the same server;
- ``mcp_stdio_execute``: the same call through the official client over stdio (``sandhold mcp``):
  the baseline, since it pays no TCP at all;
- ``healthz``: ``GET /healthz``: the HTTP floor (no tool, no container).
Target (issue 13): REST and MCP-HTTP within 1 ms of stdio at the p50.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import httpx2
from _stats import summary
from anyio.streams.text import TextReceiveStream
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

LABEL = "sandhold.bench=http"
CLI = [sys.executable, "-m", "orchestrator.cli"]
# Start-up with the image present: imports, an engine ping, the image check, the registry.
STARTUP_TIMEOUT = 120
# A stop: the server's graceful wait (5 s) and the teardown of its one session.
STOP_TIMEOUT = 60
WARM_UP = 30
TARGET_OVER_STDIO_MS = 1.0


def env(data_dir: Path, name: str) -> dict[str, str]:
    return {
        **os.environ,
        "SANDHOLD_DATA_DIR": str(data_dir),
        "SANDHOLD_ORCHESTRATOR_ID": f"bench-http-{name}-{os.getpid()}",
        "SANDHOLD_EXTRA_LABELS": LABEL,
    }


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(WARM_UP):
        await step()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


@contextlib.asynccontextmanager
async def serving(data_dir: Path) -> AsyncIterator[tuple[str, str]]:
    """``sandhold serve`` on a free loopback port: its URL and the local tenant's key."""
    process = await anyio.open_process(
        [*CLI, "serve", "--host", "127.0.0.1", "--port", "0"],
        env=env(data_dir, "serve"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        text = ""
        with anyio.fail_after(STARTUP_TIMEOUT):
            async for chunk in TextReceiveStream(process.stdout):
                text += chunk
                if len(re.findall(r"^sandhold: .*\n", text, re.MULTILINE)) >= 3:
                    break
        found = re.search(r"listening on (http://\S+) ", text)
        assert found, text
        yield found.group(1), text.splitlines()[1].rsplit(": ", 1)[1]
    finally:
        await stop(process)


async def stop(process: anyio.abc.Process) -> None:
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(STOP_TIMEOUT):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def bench_rest(url: str, key: str, rounds: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        created = (await http.post("/v1/sessions", json={"code": "0"})).json()
        sid = created["session_id"]

        async def execute() -> None:
            done = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "1+1"})
            assert done.json()["result_repr"] == "2", done.text

        async def healthz() -> None:
            assert (await http.get("/healthz")).status_code == 200

        figures = {
            "rest_execute": summary(await timed(rounds, execute)),
            "healthz": summary(await timed(rounds, healthz)),
        }
        await http.delete(f"/v1/sessions/{sid}")
    return figures


async def bench_mcp(client: Client, rounds: int) -> dict[str, float]:
    async def call(**arguments: Any) -> dict[str, Any]:
        result = await client.call_tool("python_repl", {"operation": "execute", **arguments})
        structured = result.structured_content
        assert isinstance(structured, dict), result
        assert structured["success"], structured
        return structured

    sid = (await call(code="0"))["session_id"]

    async def execute() -> None:
        assert (await call(code="1+1", session_id=sid))["result_repr"] == "2"

    samples = await timed(rounds, execute)
    await client.call_tool("python_repl", {"operation": "destroy", "session_id": sid})
    return summary(samples)


async def bench_mcp_http(url: str, key: str, rounds: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        return await bench_mcp(client, rounds)


async def bench_mcp_stdio(data_dir: Path, rounds: int) -> dict[str, float]:
    params = StdioServerParameters(
        command=CLI[0], args=[*CLI[1:], "mcp"], env=env(data_dir, "stdio")
    )
    async with Client(params) as client:
        return await bench_mcp(client, rounds)


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sandhold-bench-http-") as tmp:
        data_dir = Path(tmp)
        async with serving(data_dir / "serve") as (url, key):
            figures: dict[str, Any] = await bench_rest(url, key, rounds)
            figures["mcp_http_execute"] = await bench_mcp_http(url, key, rounds)
        figures["mcp_stdio_execute"] = await bench_mcp_stdio(data_dir / "stdio", rounds)
    stdio = figures["mcp_stdio_execute"]["p50_ms"]
    over = {
        "rest": round(figures["rest_execute"]["p50_ms"] - stdio, 3),
        "mcp_http": round(figures["mcp_http_execute"]["p50_ms"] - stdio, 3),
    }
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **figures,
        "p50_over_stdio_ms": over,
        "target_over_stdio_ms": TARGET_OVER_STDIO_MS,
        "meets_target": all(value <= TARGET_OVER_STDIO_MS for value in over.values()),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    anyio.run(main, parser.parse_args().rounds)
