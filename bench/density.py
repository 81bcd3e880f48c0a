"""Density: N idle sessions at once, measured against a bare container in the same run; prints JSON.

    .venv/bin/python bench/density.py [--sessions 100] [--concurrency 8]

- ``per_session``: each session container's memory as the engine reports it (``backend.stats``:
  the cgroup's usage, page cache included), summed, mean and p90; ``working_set`` is the same less
  inactive file pages (what ``docker stats`` shows), ``rss`` the anonymous memory alone;
- ``bare_container``: the baseline: one container made from the same spec by the same backend
  (``sleep infinity`` under docker-init) with no worker started in it;
- ``orchestrator_rss``: this process (the orchestrator) before and after the sessions exist;
- ``host_available_drop``: how much the host's available memory fell: the all-in figure, with the
  containerd shims, fuse-overlayfs mounts and dockerd's own growth (noisy when other work runs).

Sessions are spread over owners (each policy caps sessions per owner) and created with bounded
concurrency; every container is removed at the end, on every path.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import secrets
import statistics
import time
from typing import Any

import anyio
import psutil

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.docker import DockerClient
from orchestrator.images import ensure_worker_image
from orchestrator.session.session import Session

LABELS = {"sandhold.bench": "density"}
MIB = 1024 * 1024
TARGET_MIB_PER_SESSION = 25.0
# Let creation's transient memory (image layer reads, exec set-up) settle before measuring.
SETTLE_SECONDS = 3.0


def mib(value: float) -> float:
    return round(value / MIB, 2)


def distribution(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "total_mib": mib(sum(ordered)),
        "mean_mib": mib(statistics.fmean(ordered)),
        "p50_mib": mib(statistics.median(ordered)),
        "p90_mib": mib(ordered[max(int(len(ordered) * 0.9) - 1, 0)]),
        "max_mib": mib(ordered[-1]),
    }


async def memory_of(orch: Orchestrator, container_id: str) -> dict[str, float]:
    """Usage from ``backend.stats``; working set and rss from the same engine's raw stats."""
    usage = (await orch.backend.stats(container_id))["memory_bytes"]
    raw = await orch.backend.client.call(
        lambda sdk: sdk.api.stats(container_id, stream=False, one_shot=True)
    )
    detail: dict[str, Any] = (raw.get("memory_stats") or {}).get("stats") or {}
    inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))
    rss = detail.get("total_rss", detail.get("anon", 0))
    return {"usage": usage, "working_set": usage - float(inactive), "rss": float(rss)}


async def memory_of_all(orch: Orchestrator, container_ids: list[str]) -> list[dict[str, float]]:
    found: list[dict[str, float]] = [{} for _ in container_ids]

    async def one(index: int) -> None:
        found[index] = await memory_of(orch, container_ids[index])

    async with anyio.create_task_group() as tg:
        for index in range(len(container_ids)):
            tg.start_soon(one, index)
    return found


async def worker_image() -> str:
    client = DockerClient()
    try:
        return (await ensure_worker_image(client)).tag
    finally:
        await client.aclose()


async def bare_container(orch: Orchestrator, image: str) -> dict[str, float]:
    """One container from the sessions' own spec, with nothing started in it but its command."""
    spec = ContainerSpec(
        image=image,
        policy=orch.policy(None),
        session_id=secrets.token_hex(16),
        tenant="bench-bare",
        orchestrator_id=orch.config.orchestrator_id,
        extra_labels=LABELS,
    )
    container_id = await orch.backend.create_container(spec)
    try:
        await anyio.sleep(SETTLE_SECONDS)
        return await memory_of(orch, container_id)
    finally:
        with anyio.CancelScope(shield=True):
            await orch.backend.remove_container(container_id)


async def create_sessions(orch: Orchestrator, count: int, concurrency: int) -> list[Session]:
    per_owner = orch.policy(None).limits.max_sessions_per_owner
    owners = [f"bench-owner-{i}" for i in range(math.ceil(count / per_owner))]
    sessions: list[Session] = []
    limiter = anyio.CapacityLimiter(concurrency)

    async def create(index: int) -> None:
        async with limiter:
            sessions.append(await orch.create_session(tenant=owners[index % len(owners)]))

    async with anyio.create_task_group() as tg:
        for index in range(count):
            tg.start_soon(create, index)
    return sessions


async def main(count: int, concurrency: int) -> None:
    load_average = round(os.getloadavg()[0], 1)
    process = psutil.Process()
    image = await worker_image()
    config = OrchestratorConfig(
        image=image,
        orchestrator_id=f"bench-density-{secrets.token_hex(4)}",
        extra_labels=LABELS,
        max_sessions=count,
    )
    async with Orchestrator(config) as orch:
        bare = await bare_container(orch, image)
        rss_before = process.memory_info().rss
        available_before = psutil.virtual_memory().available
        started = time.perf_counter()
        sessions = await create_sessions(orch, count, concurrency)
        create_seconds = time.perf_counter() - started
        await anyio.sleep(SETTLE_SECONDS)
        memory = await memory_of_all(orch, [s.container_id for s in sessions])
        available_after = psutil.virtual_memory().available
        rss_after = process.memory_info().rss
        answers = [await orch.execute("1+1", session_id=s.id, tenant=s.tenant) for s in sessions]
        assert all(a.result_repr == "2" for a in answers), "every idle session still answers"
    usage = distribution([m["usage"] for m in memory])
    host_drop = available_before - available_after
    figures: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
            "python": platform.python_version(),
            "load_average_1m": load_average,
        },
        "sessions": count,
        "create_seconds": round(create_seconds, 1),
        "per_session": {
            "usage": usage,
            "working_set": distribution([m["working_set"] for m in memory]),
            "rss": distribution([m["rss"] for m in memory]),
        },
        "bare_container_mib": {key: mib(value) for key, value in bare.items()},
        "worker_over_bare_mean_mib": round(usage["mean_mib"] - mib(bare["usage"]), 2),
        "orchestrator_rss_mib": {
            "before": mib(rss_before),
            "after": mib(rss_after),
            "per_session": mib((rss_after - rss_before) / count),
        },
        "host_available_drop_mib": {"total": mib(host_drop), "per_session": mib(host_drop / count)},
        "target_mib_per_session": TARGET_MIB_PER_SESSION,
    }
    figures["meets_target"] = usage["p90_mib"] <= TARGET_MIB_PER_SESSION
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    anyio.run(main, args.sessions, args.concurrency)
