"""How the orchestrator's costs grow with the number of live idle sessions; prints JSON, one
entry per step (issue 21.4).

    .venv/bin/python bench/density_curve.py [--steps 10,50,100] [--concurrency 4] [--rounds 100]

Sessions are added step by step (10, then 50, then 100 alive at once; more only when asked:
``--steps 10,50,100,200,300`` needs the memory and ~5 minutes per hundred here) and at each step,
all of them idle:

- ``host_mib_per_session``: the host's ``MemAvailable`` (``/proc/meminfo``) lost since before the
  first session, over the sessions alive: all-in (shims, fuse-overlayfs, dockerd included);
- ``orchestrator_rss_mib``: this process, which is the orchestrator;
- ``execute``: ``execute("1+1")`` p50 on one session (``--rounds``);
- ``list_sessions``: the python_repl ``list_sessions`` of one owner (it filters every session);
- ``ps``: ``sandhold ps --json`` as a subprocess (it lists and stats every sandhold container on
  the engine, other work's included; its count is printed);
- ``reaper_round``: one round of the reaper's body (each session's idle and lifetime check, then
  the reconcile that lists the engine's containers of this orchestrator);
- ``per_session_ms``: each figure over the sessions alive, to see which is flat and which grows.

- ``restart_readopt``: after the figures, this orchestrator is closed leaving its sessions
  (``on_shutdown="persist"``) and a new one is started on the same registry: the seconds until
  its start has re-adopted them all (each worker reached again through a relay) and how many it
  adopted. A ``kill -9`` leaves the same containers and registry rows; the kill itself is not
  what is measured.

Every container carries ``sandhold.bench=density_curve`` and is removed at the end, on
every path (the orchestrator's close, then a sweep by label).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import docker
import psutil
from _stats import summary

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig
from orchestrator.session.session import Session

BENCH = "density_curve"
LABELS = {"sandhold.bench": BENCH}
MIB = 1024 * 1024
SETTLE_SECONDS = 3.0
SANDHOLD = str(Path(sys.executable).with_name("sandhold"))


def mem_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


async def timed(rounds: int, step: Any) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def add_sessions(
    orch: Orchestrator, sessions: list[Session], count: int, owners: list[str], concurrency: int
) -> None:
    limiter = anyio.CapacityLimiter(concurrency)

    async def create(index: int) -> None:
        async with limiter:
            sessions.append(await orch.create_session(tenant=owners[index % len(owners)]))

    async with anyio.create_task_group() as tg:
        for index in range(len(sessions), count):
            tg.start_soon(create, index)


async def reaper_round(orch: Orchestrator) -> None:
    """What one round of the reaper (``Reaper.round``) does after its sleep, less its egress
    reads and snapshot sweep."""
    for session in list(orch._table.sessions.values()):
        await orch.reaper.reap_one(session)
    await orch.reconcile()


def ps_once() -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(
        [SANDHOLD, "ps", "--json"], capture_output=True, text=True, timeout=300, check=True
    )
    took = time.perf_counter() - started
    listed = json.loads(done.stdout)
    rows = listed if isinstance(listed, list) else listed.get("sessions", listed.get("rows", []))
    return took, len(rows)


async def measure(orch: Orchestrator, sessions: list[Session], rounds: int) -> dict[str, Any]:
    one = sessions[0]

    async def execute() -> None:
        answer = await orch.execute("1+1", session_id=one.id, tenant=one.tenant)
        assert answer.result_repr == "2", answer

    async def list_sessions() -> None:
        answer = await orch.call("python_repl", {"operation": "list_sessions"}, tenant=one.tenant)
        assert answer.structured["success"], answer.text

    async def reap() -> None:
        await reaper_round(orch)

    await timed(20, execute)
    figures = {
        "execute": summary(await timed(rounds, execute)),
        "list_sessions": summary(await timed(rounds, list_sessions)),
        "reaper_round": summary(await timed(5, reap)),
    }
    ps = [await anyio.to_thread.run_sync(ps_once) for _ in range(3)]
    figures["ps"] = {**summary([took for took, _ in ps]), "containers_listed": ps[-1][1]}
    return figures


def sweep() -> None:
    """Whatever of this bench is still there (the orchestrator's close removes its sessions)."""
    client = docker.from_env(timeout=120)
    try:
        for container in client.containers.list(
            all=True, filters={"label": f"sandhold.bench={BENCH}"}
        ):
            container.remove(force=True)
    finally:
        client.close()


async def started(config: OrchestratorConfig) -> tuple[Orchestrator, float]:
    """An orchestrator started on ``config``'s registry, and how long its start took (engine
    ping, registry, image check, and the reconcile that re-adopts every session it lists)."""
    orch = Orchestrator(config)
    began = time.perf_counter()
    await orch.__aenter__()
    return orch, time.perf_counter() - began


async def main(steps: list[int], concurrency: int, rounds: int) -> None:
    process = psutil.Process()
    top = max(steps)
    curve: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sandhold-density-curve-") as directory:
        # Persisted on close, so that each step ends with a restart that re-adopts them all.
        config = OrchestratorConfig(
            orchestrator_id=f"bench-density-curve-{secrets.token_hex(4)}",
            extra_labels=LABELS,
            max_sessions=top,
            registry_path=Path(directory) / "registry.db",
            on_shutdown="persist",
        )
        orch: Orchestrator | None = None
        try:
            orch, _ = await started(config)
            per_owner = orch.policy(None).limits.max_sessions_per_owner
            owners = [f"bench-owner-{i}" for i in range(math.ceil(top / per_owner))]
            await anyio.sleep(SETTLE_SECONDS)
            available_before = mem_available()
            rss_before = process.memory_info().rss
            sessions: list[Session] = []
            for count in sorted(steps):
                began = time.perf_counter()
                await add_sessions(orch, sessions, count, owners, concurrency)
                added = time.perf_counter() - began
                await anyio.sleep(SETTLE_SECONDS)
                lost = available_before - mem_available()
                rss = process.memory_info().rss
                cpu = process.cpu_times()
                step: dict[str, Any] = {
                    "sessions": len(sessions),
                    "create_seconds": round(added, 1),
                    "host_mib_per_session": round(lost / len(sessions) / MIB, 2),
                    "orchestrator_rss_mib": round(rss / MIB, 1),
                    "orchestrator_rss_growth_kib_per_session": round(
                        (rss - rss_before) / len(sessions) / 1024, 1
                    ),
                    **await measure(orch, sessions, rounds),
                }
                step["orchestrator_cpu_s"] = round(sum(process.cpu_times()[:2]) - sum(cpu[:2]), 2)
                await orch.__aexit__(None, None, None)
                orch = None
                orch, took = await started(config)
                sessions = list(orch._table.sessions.values())
                step["restart_readopt"] = {
                    "seconds": round(took, 2),
                    "adopted": len(orch.last_reconcile.adopted),
                    "per_session_ms": round(took * 1000 / step["sessions"], 1),
                }
                answer = await orch.execute(
                    "1+1", session_id=sessions[0].id, tenant=sessions[0].tenant
                )
                assert answer.result_repr == "2", answer
                step["per_session_ms"] = {
                    name: round(step[name]["p50_ms"] / len(sessions), 3)
                    for name in ("list_sessions", "reaper_round", "ps")
                }
                curve.append(step)
                print(json.dumps(step), file=sys.stderr, flush=True)
        finally:
            try:
                # Not in a shielded scope: the orchestrator's task group must exit innermost.
                if orch is not None:
                    await orch.__aexit__(None, None, None)
                # The last start re-adopts what is left and its close removes it all.
                async with Orchestrator(dataclasses.replace(config, on_shutdown="destroy")):
                    pass
            finally:
                sweep()
    first, last = curve[0], curve[-1]
    growth = {
        name: round(last[name]["p50_ms"] / max(first[name]["p50_ms"], 1e-9), 2)
        for name in ("execute", "list_sessions", "reaper_round", "ps")
    }
    figures = {
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "curve": curve,
        "sessions_ratio": round(last["sessions"] / first["sessions"], 1),
        "p50_ratio_last_over_first": growth,
        "host_mib_per_session_spread": round(
            statistics.pstdev(step["host_mib_per_session"] for step in curve), 2
        ),
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10,50,100")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    arguments = parser.parse_args()
    steps = [int(part) for part in arguments.steps.split(",") if part.strip()]
    anyio.run(main, steps, arguments.concurrency, arguments.rounds)
