"""Session ready: cold (container create + start + worker ready) against a warm pool, measured in
the same run; prints JSON.

    .venv/bin/python bench/session_ready.py [--rounds 20]

Each pooled take waits for the pool to refill first, so every sample is a real pool hit.
"""

from __future__ import annotations

import argparse
import json
import time

import anyio
from _stats import summary

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig

LABELS = {"sandhold.bench": "session-ready"}
POOL_SIZE = 2


async def refilled(orch: Orchestrator) -> None:
    with anyio.fail_after(120):
        while orch.pool_status()["default"]["ready"] < POOL_SIZE:  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def main(rounds: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-ready", extra_labels=LABELS)
    async with Orchestrator(config) as orch:
        cold: list[float] = []
        for _ in range(rounds):
            started = time.perf_counter()
            session = await orch.create_session()
            cold.append(time.perf_counter() - started)
            await orch.destroy(session.id)
        await orch.set_pool_size("default", POOL_SIZE)
        pooled: list[float] = []
        for _ in range(rounds):
            await refilled(orch)
            started = time.perf_counter()
            session = await orch.create_session()
            pooled.append(time.perf_counter() - started)
            assert (await orch.execute("1+1", session_id=session.id)).result_repr == "2"
            await orch.destroy(session.id)
    figures = {
        "cold_session": summary(cold),
        "pool_session": summary(pooled),
        "target_pool_p50_ms": 20.0,
    }
    figures["pool_speedup_p50"] = round(
        figures["cold_session"]["p50_ms"] / figures["pool_session"]["p50_ms"], 1
    )
    figures["meets_target"] = figures["pool_session"]["p50_ms"] <= 20.0
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    anyio.run(main, parser.parse_args().rounds)
