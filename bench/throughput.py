"""Throughput: sessions executing in parallel against one session executing sequentially, each for
the same fixed window in the same run; prints JSON.

    .venv/bin/python bench/throughput.py [--sessions 20] [--seconds 10]

The cell is CPU-light (``sum(range(1000))``), so the figure is the cost of the round trip
(orchestrator, engine stream, worker) and not of the code. ``orchestrator_cpu_share`` is this
process's CPU time over the window: near 1.0 means the orchestrator's one thread is the limit;
``host_cpu_busy_share`` is the whole host's (every core, other work included): near 1.0 means the
machine is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import secrets
import time
from typing import Any

import anyio
import psutil
from _stats import summary

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator.session.session import Session

LABELS = {"sandhold.bench": "throughput"}
CELL = "sum(range(1000))"
EXPECTED = repr(sum(range(1000)))
WARMUP_ROUNDS = 20


async def drive(orch: Orchestrator, session: Session, until: float, samples: list[float]) -> None:
    """Execute the cell back to back on one session until the deadline."""
    while (started := time.perf_counter()) < until:
        result = await orch.execute(CELL, session_id=session.id, tenant=session.tenant)
        samples.append(time.perf_counter() - started)
        assert result.result_repr == EXPECTED, result


async def window(orch: Orchestrator, sessions: list[Session], seconds: float) -> dict[str, Any]:
    """All ``sessions`` executing at once for ``seconds``: executes per second and latencies."""
    samples: list[float] = []
    process = psutil.Process()
    cpu_before = sum(process.cpu_times()[:2])
    psutil.cpu_percent()  # starts the host-wide measurement
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(drive, orch, session, started + seconds, samples)
    elapsed = time.perf_counter() - started
    cpu = sum(process.cpu_times()[:2]) - cpu_before
    host_busy = psutil.cpu_percent() / 100
    return {
        "sessions": len(sessions),
        "seconds": round(elapsed, 2),
        "executes": len(samples),
        "executes_per_second": round(len(samples) / elapsed, 1),
        "latency": summary(samples),
        "orchestrator_cpu_share": round(cpu / elapsed, 2),
        "host_cpu_busy_share": round(host_busy, 2),
    }


async def open_sessions(orch: Orchestrator, count: int) -> list[Session]:
    per_owner = orch.policy(None).limits.max_sessions_per_owner
    owners = [f"bench-owner-{i}" for i in range(math.ceil(count / per_owner))]
    sessions = [await orch.create_session(tenant=owners[i % len(owners)]) for i in range(count)]
    for session in sessions:
        for _ in range(WARMUP_ROUNDS):
            await orch.execute(CELL, session_id=session.id, tenant=session.tenant)
    return sessions


async def main(count: int, seconds: float) -> None:
    load_average = round(os.getloadavg()[0], 1)
    config = OrchestratorConfig(
        orchestrator_id=f"bench-throughput-{secrets.token_hex(4)}",
        extra_labels=LABELS,
        max_sessions=count,
    )
    async with Orchestrator(config) as orch:
        sessions = await open_sessions(orch, count)
        sequential = await window(orch, sessions[:1], seconds)
        parallel = await window(orch, sessions, seconds)
    figures: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": load_average,
        },
        "cell": CELL,
        "sequential": sequential,
        "parallel": parallel,
        "parallel_over_sequential": round(
            parallel["executes_per_second"] / sequential["executes_per_second"], 2
        ),
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    anyio.run(main, args.sessions, args.seconds)
