"""runc against runsc (gVisor) in the same run, same policy otherwise; prints JSON.

    .venv/bin/python bench/runtimes.py [--rounds 300] [--cold-rounds 10] [--idle-sessions 5]

For each runtime the engine has:

- ``execute_1p1``: ``execute("1+1")`` on an existing session through the public Python API;
- ``cold_session``: create a session (container + ready worker) and destroy it;
- ``idle_memory``: memory of idle sessions as the engine reports it (``backend.stats``).

runc is the baseline. Without a ``runsc`` runtime (``.ci/install-runsc`` registers it) only runc
is measured and ``runsc`` says why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _stats import summary

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator.errors import OrchestratorError

LABELS = {"sandhold.bench": "runtimes"}
RUNTIMES = ("runc", "runsc")
MIB = 1024 * 1024
WARMUP_ROUNDS = 50
# Let creation's transient memory settle before measuring idle sessions.
SETTLE_SECONDS = 3.0


def write_policies(directory: Path) -> None:
    """One policy per runtime, each the default policy but for ``runtime``."""
    for runtime in RUNTIMES:
        (directory / f"bench-{runtime}.toml").write_text(
            f'name = "bench-{runtime}"\nextends = "default"\nruntime = "{runtime}"\n'
        )


async def bench_execute(orch: Orchestrator, policy: str, rounds: int) -> list[float]:
    session = await orch.create_session(policy=policy)
    try:
        samples = []
        for index in range(WARMUP_ROUNDS + rounds):
            started = time.perf_counter()
            result = await orch.execute("1+1", session_id=session.id)
            if index >= WARMUP_ROUNDS:
                samples.append(time.perf_counter() - started)
            assert result.result_repr == "2", result
        return samples
    finally:
        await orch.destroy(session.id)


async def bench_cold(orch: Orchestrator, policy: str, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        session = await orch.create_session(policy=policy)
        samples.append(time.perf_counter() - started)
        await orch.destroy(session.id)
    return samples


async def idle_memory(orch: Orchestrator, policy: str, count: int) -> dict[str, float]:
    sessions = [await orch.create_session(policy=policy) for _ in range(count)]
    try:
        await anyio.sleep(SETTLE_SECONDS)
        usage = [(await orch.backend.stats(s.container_id))["memory_bytes"] for s in sessions]
    finally:
        for session in sessions:
            await orch.destroy(session.id)
    return {
        "n": count,
        "mean_mib": round(statistics.fmean(usage) / MIB, 2),
        "max_mib": round(max(usage) / MIB, 2),
    }


async def measure(orch: Orchestrator, runtime: str, args: argparse.Namespace) -> dict[str, Any]:
    policy = f"bench-{runtime}"
    return {
        "execute_1p1": summary(await bench_execute(orch, policy, args.rounds)),
        "cold_session": summary(await bench_cold(orch, policy, args.cold_rounds)),
        "idle_memory": await idle_memory(orch, policy, args.idle_sessions),
    }


def ratios(runc: dict[str, Any], runsc: dict[str, Any]) -> dict[str, float]:
    """runsc over runc: how many times slower (or larger) gVisor is."""
    return {
        "execute_p50": round(runsc["execute_1p1"]["p50_ms"] / runc["execute_1p1"]["p50_ms"], 2),
        "cold_session_p50": round(
            runsc["cold_session"]["p50_ms"] / runc["cold_session"]["p50_ms"], 2
        ),
        "idle_memory_mean": round(
            runsc["idle_memory"]["mean_mib"] / runc["idle_memory"]["mean_mib"], 2
        ),
    }


async def main(args: argparse.Namespace) -> None:
    load_average = round(os.getloadavg()[0], 1)
    with tempfile.TemporaryDirectory(prefix="sandhold-bench-") as directory:
        write_policies(Path(directory))
        config = OrchestratorConfig(
            orchestrator_id=f"bench-runtimes-{secrets.token_hex(4)}",
            extra_labels=LABELS,
            policy_dirs=(Path(directory),),
        )
        async with Orchestrator(config) as orch:
            figures: dict[str, Any] = {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_1m": load_average,
                },
                "runc": await measure(orch, "runc", args),
            }
            if "runsc" not in await orch.backend.runtimes():
                figures["runsc"] = "not measured: the engine has no runsc runtime"
            else:
                try:
                    figures["runsc"] = await measure(orch, "runsc", args)
                except OrchestratorError as exc:
                    figures["runsc"] = f"not measured: {type(exc).__name__}: {exc}"
    if isinstance(figures["runsc"], dict):
        figures["runsc_over_runc"] = ratios(figures["runc"], figures["runsc"])
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--cold-rounds", type=int, default=10)
    parser.add_argument("--idle-sessions", type=int, default=5)
    anyio.run(main, parser.parse_args())
