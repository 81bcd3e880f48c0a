"""``sandhold mcp`` start-up, as a client that spawns it sees it; prints JSON.

    .venv/bin/python bench/mcp_startup.py [--rounds 10]

Each round spawns a fresh process and speaks MCP's JSON-RPC lines to it (the initialize handshake
most clients send), timing from the spawn to: ``initialize`` answered, ``tools/list`` answered,
and the first ``execute`` answered (which creates a session); then closes stdin, which ends the
process and its session. Measured for ``sandhold mcp`` (its own orchestrator) and for
``sandhold mcp --connect`` in front of one ``sandhold serve`` started for the run (the session is
made in the server; the front needs no engine). Target (issue 13): initialize answered within 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from _stats import summary
from anyio.streams.text import TextReceiveStream

LABELS = "sandhold.bench=mcp_startup"
TARGET_INITIALIZE_MS = 500.0
# Generous bounds for a loaded machine: a round, and sandhold serve's start-up and stop.
ROUND_TIMEOUT = 120.0
SERVE_TIMEOUT = 120.0
SANDHOLD = [sys.executable, "-m", "orchestrator.cli"]


class Lines:
    """Newline-delimited JSON-RPC with one spawned server."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._text = TextReceiveStream(process.stdout)
        self._buffer = ""
        self._id = 0

    async def send(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            self._id += 1
            message |= {"id": self._id, "params": params}
        assert self.process.stdin is not None
        await self.process.stdin.send((json.dumps(message) + "\n").encode())

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        await self.send(method, params)
        while True:
            while "\n" not in self._buffer:
                self._buffer += await self._text.receive()
            line, self._buffer = self._buffer.split("\n", 1)
            frame = json.loads(line)
            if frame.get("id") == self._id:
                if "error" in frame:
                    raise RuntimeError(f"{method}: {frame['error']}")
                return dict(frame["result"])


async def one_round(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    started = time.perf_counter()
    process = await anyio.open_process(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(ROUND_TIMEOUT):
            lines = Lines(process)
            await lines.request(
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"},
                },
            )
            initialized = time.perf_counter()
            await lines.send("notifications/initialized")
            await lines.request("tools/list", {})
            listed = time.perf_counter()
            arguments = {"operation": "execute", "code": "1 + 1"}
            answer = await lines.request(
                "tools/call", {"name": "python_repl", "arguments": arguments}
            )
            executed = time.perf_counter()
            if answer["structuredContent"].get("result_repr") != "2":
                raise RuntimeError(f"execute failed: {answer}")
            assert process.stdin is not None
            await process.stdin.aclose()
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return {
        "initialize": initialized - started,
        "tools_list": listed - started,
        "first_execute": executed - started,
    }


async def measure(argv: list[str], env: dict[str, str], rounds: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"initialize": [], "tools_list": [], "first_execute": []}
    for _ in range(rounds):
        for name, seconds in (await one_round(argv, env)).items():
            samples[name].append(seconds)
    return {name: summary(values) for name, values in samples.items()}


@asynccontextmanager
async def serving(env: dict[str, str]) -> AsyncIterator[tuple[str, str]]:
    """``sandhold serve`` on a free loopback port for the run: its URL and API key."""
    process = await anyio.open_process(
        [*SANDHOLD, "serve", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        text = ""
        with anyio.fail_after(SERVE_TIMEOUT):
            async for chunk in TextReceiveStream(process.stdout):
                text += chunk
                if len(re.findall(r"^sandhold: .*\n", text, re.MULTILINE)) >= 3:
                    break
        url = re.search(r"listening on (http://\S+)", text)
        key = re.search(r"shown once.*: (\S+)$", text, re.MULTILINE)
        if url is None or key is None:
            raise RuntimeError(f"sandhold serve did not start: {text!r}")
        yield url.group(1), key.group(1)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(SERVE_TIMEOUT):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def main(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sandhold-bench-mcp-") as data:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")},
            "SANDHOLD_DATA_DIR": str(Path(data)),
            "SANDHOLD_EXTRA_LABELS": LABELS,
            "SANDHOLD_ORCHESTRATOR_ID": f"bench-mcp-{secrets.token_hex(4)}",
        }
        if "SANDHOLD_IMAGE" in os.environ:
            env["SANDHOLD_IMAGE"] = os.environ["SANDHOLD_IMAGE"]
        local = await measure([*SANDHOLD, "mcp"], env, rounds)
        serve_env = {**env, "SANDHOLD_ORCHESTRATOR_ID": f"bench-serve-{secrets.token_hex(4)}"}
        async with serving(serve_env) as (url, key):
            front_env = {k: v for k, v in env.items() if k != "SANDHOLD_ORCHESTRATOR_ID"}
            front = await measure(
                [*SANDHOLD, "mcp", "--connect", url], {**front_env, "SANDHOLD_API_KEY": key}, rounds
            )
    return {
        "mcp": local,
        "mcp_connect": front,
        "target_initialize_p50_ms": TARGET_INITIALIZE_MS,
        "meets_target": local["initialize"]["p50_ms"] <= TARGET_INITIALIZE_MS
        and front["initialize"]["p50_ms"] <= TARGET_INITIALIZE_MS,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    print(json.dumps(anyio.run(main, parser.parse_args().rounds), indent=2))
