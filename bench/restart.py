"""Restart: what the on-disk registry costs, and how fast a restart gets sessions back; prints JSON.

    .venv/bin/python bench/restart.py [--sessions 10] [--rounds 300]

Measured in one run:
- ``execute("1+1")`` with the registry in memory against the registry on disk (each execute
  writes its history row): the price of surviving a crash on the hot path.
- A restart: N sessions, each holding a variable, are left running (``on_shutdown="persist"``,
  which leaves them as a ``kill -9`` would, plus a clean stop of their terminals); a new
  orchestrator on the same registry starts and re-adopts them. Reported per session, against
  creating N cold sessions in the same run (what a restart without re-adoption would cost, and
  the state would be lost).
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path

import anyio
from _stats import summary

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator.backend.docker import DockerBackend

LABELS = {"sandhold.bench": "restart"}


async def execute_latency(config: OrchestratorConfig, rounds: int) -> dict[str, float]:
    async with Orchestrator(config) as orch:
        session_id = (await orch.execute("0")).session_id
        for _ in range(20):  # warm up
            await orch.execute("1+1", session_id=session_id)
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            await orch.execute("1+1", session_id=session_id)
            samples.append(time.perf_counter() - started)
    return summary(samples)


async def restart(config: OrchestratorConfig, sessions: int) -> dict[str, object]:
    async with Orchestrator(config) as orch:
        ids = []
        for index in range(sessions):
            ids.append((await orch.execute(f"kept = {index}")).session_id)
    started = time.perf_counter()
    async with Orchestrator(config) as orch:
        adopted_s = time.perf_counter() - started
        report = orch.last_reconcile
        for index, session_id in enumerate(ids):
            outcome = await orch.execute("kept", session_id=session_id)
            if outcome.result_repr != str(index) or outcome.state_reset:
                raise RuntimeError(f"session {session_id} lost its state: {outcome}")
            await orch.destroy(session_id)
        cold = []
        for _ in range(sessions):
            began = time.perf_counter()
            session = await orch.create_session()
            cold.append(time.perf_counter() - began)
            await orch.destroy(session.id)
    return {
        "sessions": sessions,
        "adopted": len(report.adopted),
        "restart_total_ms": round(adopted_s * 1000, 1),
        "restart_per_session_ms": round(adopted_s * 1000 / sessions, 1),
        "cold_session": summary(cold),
    }


async def remove_leftovers() -> None:
    """Sessions a failed run left persisted: the bench's own containers, by its label."""
    backend = DockerBackend()
    for container_id in await backend.list_containers(LABELS):
        await backend.remove_container(container_id)


async def main(sessions: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sandhold-bench-") as directory:
        run = secrets.token_hex(4)
        memory = OrchestratorConfig(orchestrator_id=f"bench-mem-{run}", extra_labels=LABELS)
        disk = OrchestratorConfig(
            orchestrator_id=f"bench-disk-{run}",
            extra_labels=LABELS,
            registry_path=Path(directory) / "registry.db",
            on_shutdown="persist",
        )
        in_memory = await execute_latency(memory, rounds)
        on_disk = await execute_latency(
            OrchestratorConfig(
                orchestrator_id=f"bench-disk1-{run}",
                extra_labels=LABELS,
                registry_path=Path(directory) / "latency.db",
            ),
            rounds,
        )
        figures: dict[str, object] = {
            "execute_registry_in_memory": in_memory,
            "execute_registry_on_disk": on_disk,
            "registry_cost_p50_ms": round(on_disk["p50_ms"] - in_memory["p50_ms"], 3),
        }
        try:
            figures["restart"] = await restart(disk, sessions)
        finally:
            await remove_leftovers()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=300)
    options = parser.parse_args()
    anyio.run(main, options.sessions, options.rounds)
