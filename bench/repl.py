"""python_repl round trip, measured against its baselines in the same run; prints JSON.

    .venv/bin/python bench/repl.py [--rounds 500]

- ``execute_1p1``: ``execute("1+1")`` through the public Python API (an existing session);
- ``raw_stream_echo``: one line through an attached exec running ``cat``: the floor for any
  request over an attached stream;
- ``docker_exec``: ``docker exec <container> python3 -c 1+1``: what exec-per-call sandboxes pay;
- ``cold_session``: create a session (container + ready worker) and destroy it.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from collections.abc import Awaitable, Callable

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator.backend.base import ExecSpec

LABELS = {"sandhold.bench": "repl"}


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def bench_execute(orch: Orchestrator, session_id: str, rounds: int) -> list[float]:
    async def step() -> None:
        result = await orch.execute("1+1", session_id=session_id)
        assert result.result_repr == "2", result

    await timed(50, step)
    return await timed(rounds, step)


async def bench_raw_echo(orch: Orchestrator, container_id: str, rounds: int) -> list[float]:
    stream = await orch.backend.open_exec(container_id, ExecSpec(argv=["cat"]))
    try:

        async def step() -> None:
            await stream.send(b'{"id":"r1","op":"ping"}\n')
            got = b""
            while not got.endswith(b"\n"):
                chunk = await stream.receive()
                assert chunk is not None
                got += chunk[1]

        await timed(50, step)
        return await timed(rounds, step)
    finally:
        await stream.aclose()


def bench_docker_exec(container_id: str, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(
            ["docker", "exec", container_id, "python3", "-c", "1+1"], check=True, timeout=60
        )
        samples.append(time.perf_counter() - started)
    return samples


async def bench_cold(orch: Orchestrator, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        session = await orch.create_session()
        samples.append(time.perf_counter() - started)
        await orch.destroy(session.id)
    return samples


async def main(rounds: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-repl", extra_labels=LABELS)
    async with Orchestrator(config) as orch:
        session = await orch.create_session()
        execute = await bench_execute(orch, session.id, rounds)
        raw = await bench_raw_echo(orch, session.container_id, rounds)
        exec_samples = await anyio.to_thread.run_sync(
            bench_docker_exec, session.container_id, max(rounds // 25, 10)
        )
        cold = await bench_cold(orch, 10)
    figures = {
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "execute_1p1": summary(execute),
        "raw_stream_echo": summary(raw),
        "docker_exec": summary(exec_samples),
        "cold_session": summary(cold),
    }
    figures["execute_vs_docker_exec_speedup"] = round(
        figures["docker_exec"]["p50_ms"] / figures["execute_1p1"]["p50_ms"], 1
    )
    figures["execute_over_raw_stream_ms"] = round(
        figures["execute_1p1"]["p50_ms"] - figures["raw_stream_echo"]["p50_ms"], 3
    )
    figures["target_execute_p50_ms"] = 1.0
    figures["meets_target"] = figures["execute_1p1"]["p50_ms"] <= 1.0
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    anyio.run(main, parser.parse_args().rounds)
