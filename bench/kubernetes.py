"""The Kubernetes backend beside Docker, in the same run; prints JSON.

    .venv/bin/python bench/kubernetes.py [--rounds 300] [--sessions 50] [--pool-rounds 10]

Needs the cluster of ``.ci/kube-cluster start`` (its admin kubeconfig and the worker image it
imported). For each backend, through the public Python API:

- ``execute_1p1``: ``execute("1+1")`` on an existing session (the REPL worker's round trip);
- ``raw_stream_echo``: one line through an attached exec running ``cat`` (the floor of a request
  over an attached stream: Docker's attach socket, or the API server's websocket through the
  relay in the Pod);
- ``one_shot_exec``: ``true`` run to completion (an exec per call);
- ``cold_session``: create a session (a container or a Pod, and a ready worker) and destroy it;
- ``pool_session``: a session taken from a warm pool of 2 (each take waits for the refill first,
  so every sample is a pool hit), then ``1+1`` in it, against ``cold_session`` of the same policy;
- ``many``: ``--sessions`` sessions made (8 at a time), ``1+1`` in each, all destroyed: the time
  of each phase and the orchestrator's RSS (this process: what ``serve`` would hold) before, at
  its peak and after.

``pool_session`` and ``many`` use a small policy (``bench-small``: 0.05 CPU, 128 MiB) since a Pod's
CPU request equals its limit (the Guaranteed class) and this 2-core node holds two 1-CPU sessions:
on Kubernetes ``many`` makes what fits (the node's allocatable CPU divided by 50m, less one for
the probe and the kubelet's own rounding), Docker the same count in the same run. The CFS quota
of 0.05 CPU slows a worker's start (its CPU time is throttled to 5 ms in 100 ms): the figures
say what a dense, mostly idle cluster of such sessions costs, not a 1-CPU session's speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator._core.config import BackendConfig
from orchestrator.backend.base import ExecSpec

RUN = Path("/run/sandhold-kube")
KUBERNETES = {
    "kubeconfig": str(RUN / "admin.kubeconfig"),
    "namespace": "default",
    "seccomp_profile": "localhost/sandhold.json",
    "pod_pids_limit": 256,
    "network_isolated": True,
    # One node: on a two-node test cluster both nodes are this one machine's 2 cores.
    "node_selector": {"kubernetes.io/hostname": "sandhold-node-1"},
}
# A Pod takes a second or more to start: fewer cold rounds than warm ones.
COLD_ROUNDS = 5
SMALL_POLICY = "bench-small"
SMALL_CPU_M = 50
SMALL_POLICY_TOML = f"""
name = "{SMALL_POLICY}"
extends = "default"
description = "bench/kubernetes.py: many small sessions on a 2-core node"
[resources]
cpus = {SMALL_CPU_M / 1000}
memory_mb = 128
tmp_mb = 16
workspace_mb = 32
home_mb = 16
shm_mb = 8
[limits]
max_sessions_per_owner = 100
"""
POOL_SIZE = 2
# Creating many sessions: as the density bench does, a few at a time.
CONCURRENCY = 8
# A refill of the pool is one session's start: seconds; a Pod at 0.05 CPU, tens of them.
REFILL_TIMEOUT = 300.0
# The RSS is sampled this often while ``many`` runs (its peak).
RSS_SAMPLE_S = 0.05


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def measure(config: OrchestratorConfig, rounds: int) -> dict[str, Any]:
    async with Orchestrator(config) as orch:
        first = await orch.execute("0")
        sid = first.session_id
        container = orch.find_session(sid).container_id

        async def execute() -> None:
            assert (await orch.execute("1+1", session_id=sid)).result_repr == "2"

        stream = await orch.backend.open_exec(container, ExecSpec(argv=["cat"]))

        async def echo() -> None:
            await stream.send(b"ping\n")
            assert await stream.receive() is not None

        async def one_shot() -> None:
            await orch.backend.run(
                container, ExecSpec(argv=["true"]), timeout=30, max_output_bytes=64
            )

        async def cold() -> None:
            made = await orch.execute("1")
            await orch.destroy(made.session_id)

        await timed(20, execute)
        figures = {
            "execute_1p1": summary(await timed(rounds, execute)),
            "raw_stream_echo": summary(await timed(rounds, echo)),
            "one_shot_exec": summary(await timed(max(rounds // 10, 10), one_shot)),
        }
        await stream.aclose()
        await orch.destroy(sid)
        figures["cold_session"] = summary(await timed(COLD_ROUNDS, cold))
        return figures


async def pool(config: OrchestratorConfig, rounds: int) -> dict[str, Any]:
    async def refilled(orch: Orchestrator) -> None:
        with anyio.fail_after(REFILL_TIMEOUT):
            while orch.pool_status()[SMALL_POLICY]["ready"] < POOL_SIZE:  # noqa: ASYNC110
                await anyio.sleep(0.05)

    async with Orchestrator(config) as orch:
        cold: list[float] = []
        for _ in range(rounds):
            started = time.perf_counter()
            session = await orch.create_session(policy=SMALL_POLICY)
            cold.append(time.perf_counter() - started)
            await orch.destroy(session.id)
        await orch.set_pool_size(SMALL_POLICY, POOL_SIZE)
        pooled: list[float] = []
        for _ in range(rounds):
            await refilled(orch)
            started = time.perf_counter()
            session = await orch.create_session(policy=SMALL_POLICY)
            pooled.append(time.perf_counter() - started)
            run = await orch.execute("1+1", session_id=session.id)
            assert run.result_repr == "2"
            await orch.destroy(session.id)
        await orch.set_pool_size(SMALL_POLICY, 0)
    return {"cold_session": summary(cold), "pool_session": summary(pooled)}


async def many(config: OrchestratorConfig, count: int) -> dict[str, Any]:
    process = psutil.Process()
    peak = process.memory_info().rss
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def sample(scope: anyio.CancelScope) -> None:
        nonlocal peak
        with scope:
            while True:
                peak = max(peak, process.memory_info().rss)
                await anyio.sleep(RSS_SAMPLE_S)

    async with Orchestrator(config) as orch:
        rss_before = process.memory_info().rss
        ids: list[str] = []
        phases: dict[str, float] = {}
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()
            tg.start_soon(sample, scope)
            try:

                async def create() -> None:
                    async with limiter:
                        ids.append((await orch.create_session(policy=SMALL_POLICY)).id)

                async def execute(sid: str) -> None:
                    async with limiter:
                        answer = await orch.execute("1+1", session_id=sid)
                        assert answer.result_repr == "2"

                async def destroy(sid: str) -> None:
                    async with limiter:
                        await orch.destroy(sid)

                started = time.perf_counter()
                async with anyio.create_task_group() as inner:
                    for _ in range(count):
                        inner.start_soon(create)
                phases["create_all_s"] = time.perf_counter() - started
                started = time.perf_counter()
                async with anyio.create_task_group() as inner:
                    for sid in ids:
                        inner.start_soon(execute, sid)
                phases["execute_each_s"] = time.perf_counter() - started
                rss_full = process.memory_info().rss
                started = time.perf_counter()
                async with anyio.create_task_group() as inner:
                    for sid in list(ids):
                        inner.start_soon(destroy, sid)
                phases["destroy_all_s"] = time.perf_counter() - started
            finally:
                scope.cancel()
        mib = 1024 * 1024
        return {
            "sessions": count,
            **{name: round(value, 2) for name, value in phases.items()},
            "rss_mib": {
                "before": round(rss_before / mib, 1),
                "with_all_sessions": round(rss_full / mib, 1),
                "peak": round(peak / mib, 1),
                "after": round(process.memory_info().rss / mib, 1),
            },
        }


async def kubernetes_room(config: OrchestratorConfig) -> int:
    """How many ``bench-small`` Pods the cluster's nodes take: their allocatable CPU over 50m
    each, less one a node (the kubelet rounds, the seccomp probe takes 10m)."""
    async with Orchestrator(config) as orch:
        api = orch.backend.api  # type: ignore[attr-defined]
        nodes = await api.request("GET", "/api/v1/nodes")
    room = 0
    selector = KUBERNETES["node_selector"]["kubernetes.io/hostname"]
    for node in nodes.get("items") or []:
        if node["metadata"]["name"] != selector:
            continue
        cpu = str(node["status"]["allocatable"]["cpu"])
        millis = int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)
        room += math.floor(millis / SMALL_CPU_M) - 1
    return room


async def main(rounds: int, sessions: int, pool_rounds: int) -> dict[str, Any]:
    image = (RUN / "worker-image").read_text().strip()
    with tempfile.TemporaryDirectory() as policies:
        (Path(policies) / f"{SMALL_POLICY}.toml").write_text(SMALL_POLICY_TOML)
        docker = OrchestratorConfig(
            image=image,
            extra_labels={"sandhold.bench": "kubernetes"},
            policy_dirs=(Path(policies),),
            max_sessions=max(sessions, 100),
        )
        kubernetes = OrchestratorConfig(
            image=image,
            backend=BackendConfig(name="kubernetes", options=KUBERNETES),
            policy_dirs=(Path(policies),),
            max_sessions=max(sessions, 100),
        )
        fits = min(sessions, await kubernetes_room(kubernetes))
        figures: dict[str, Any] = {
            "load_average": round(os.getloadavg()[0], 1),
            "sessions_asked": sessions,
            "sessions_that_fit_on_kubernetes": fits,
        }
        for name, config in (("docker", docker), ("kubernetes", kubernetes)):
            figures[name] = await measure(config, rounds)
            figures[name]["pool"] = await pool(config, pool_rounds)
            figures[name]["many"] = await many(config, fits)
        return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--pool-rounds", type=int, default=10)
    arguments = parser.parse_args()
    figures = anyio.run(main, arguments.rounds, arguments.sessions, arguments.pool_rounds)
    print(json.dumps(figures, indent=2))
