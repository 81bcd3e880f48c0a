"""The files tool's round trip against an execute's, measured in the same run; prints JSON.

    .venv/bin/python bench/files.py [--rounds 300]

Everything goes through ``Orchestrator.call`` on one session whose file helper has started:

- ``execute_1``: ``python_repl`` ``execute("1")``: the baseline, a round trip to the REPL worker;
- ``files_write_read_1k``: ``files`` ``write`` of a 1 KiB text file, then ``read`` of it (one
  sample is both calls); ``files_write_1k`` and ``files_read_1k`` are each call alone;
- ``files_first_write``: the first ``write`` of a fresh session, which starts its file helper
  (one exec), over a few sessions;
- ``oneshot_read_1k``: the same read as one run of the helper (``helper_exchange``), the way every
  file operation went before the served helper (and archives still go).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Awaitable, Callable

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator.session.files.operations import FILEOPS_ARGV
from orchestrator.session.files.wire import FILE_HELPER
from orchestrator.session.helper_exchange import call_helper

LABELS = {"sandhold.bench": "files"}
CONTENT = "x" * 1024
WARMUP = 30
BLOCKS = 10


def with_p95(samples: list[float]) -> dict[str, float]:
    figures = summary(samples)
    ms = sorted(s * 1000 for s in samples)
    figures["p95_ms"] = round(ms[max(int(len(ms) * 0.95) - 1, 0)], 3)
    return figures


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def ok(orch: Orchestrator, tool: str, **arguments: object) -> dict[str, object]:
    result = await orch.call(tool, dict(arguments))
    assert result.structured["success"], result.structured
    return result.structured


async def bench_session(orch: Orchestrator, rounds: int) -> dict[str, list[float]]:
    sid = (await ok(orch, "python_repl", operation="execute", code="1"))["session_id"]
    write = {"operation": "write", "session_id": sid, "path": "bench.txt", "content": CONTENT}
    read = {"operation": "read", "session_id": sid, "path": "bench.txt"}

    async def execute() -> None:
        await ok(orch, "python_repl", operation="execute", session_id=sid, code="1")

    async def write_read() -> None:
        await ok(orch, "files", **write)
        assert (await ok(orch, "files", **read))["content"] == CONTENT

    async def write_only() -> None:
        await ok(orch, "files", **write)

    async def read_only() -> None:
        await ok(orch, "files", **read)

    steps = {
        "execute_1": execute,
        "files_write_read_1k": write_read,
        "files_write_1k": write_only,
        "files_read_1k": read_only,
    }
    for step in steps.values():
        await timed(WARMUP, step)
    figures: dict[str, list[float]] = {name: [] for name in steps}
    # In interleaved blocks, so a burst of load from elsewhere lands on every figure alike.
    for _ in range(BLOCKS):
        for name, step in steps.items():
            figures[name] += await timed(max(rounds // BLOCKS, 1), step)

    container_id = orch.find_session(str(sid)).container_id

    async def oneshot() -> None:
        request = {"path": "/workspace/bench.txt", "max_bytes": 1 << 20}
        await call_helper(
            orch.backend,
            container_id,
            FILE_HELPER,
            [*FILEOPS_ARGV, "read"],
            request,
            max_reply_bytes=1 << 22,
            timeout=60,
        )

    figures["oneshot_read_1k"] = await timed(max(rounds // 15, 10), oneshot)
    await ok(orch, "python_repl", operation="destroy", session_id=sid)
    return figures


async def bench_first_write(orch: Orchestrator, sessions: int) -> list[float]:
    samples = []
    for _ in range(sessions):
        sid = (await ok(orch, "python_repl", operation="execute", code="1"))["session_id"]
        started = time.perf_counter()
        await ok(orch, "files", operation="write", session_id=sid, path="a.txt", content=CONTENT)
        samples.append(time.perf_counter() - started)
        await ok(orch, "python_repl", operation="destroy", session_id=sid)
    return samples


async def main(rounds: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-files", extra_labels=LABELS)
    async with Orchestrator(config) as orch:
        samples = await bench_session(orch, rounds)
        samples["files_first_write"] = await bench_first_write(orch, 5)
    figures: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        **{name: with_p95(values) for name, values in samples.items()},
    }
    execute = with_p95(samples["execute_1"])
    pair = with_p95(samples["files_write_read_1k"])
    oneshot = with_p95(samples["oneshot_read_1k"])
    read = with_p95(samples["files_read_1k"])
    figures["write_read_over_execute_p50"] = round(pair["p50_ms"] / execute["p50_ms"], 2)
    figures["write_read_over_execute_p95"] = round(pair["p95_ms"] / execute["p95_ms"], 2)
    figures["oneshot_read_over_served_read_p50"] = round(oneshot["p50_ms"] / read["p50_ms"], 1)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    anyio.run(main, parser.parse_args().rounds)
