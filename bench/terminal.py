"""The persistent shell's ``run("echo hi")`` against ``docker exec`` in the same run; prints JSON.

    .venv/bin/python bench/terminal.py [--rounds 300]

- ``shell_run``: ``terminal`` tool, operation ``run``, through ``Orchestrator.call`` (what every
  interface calls), on an existing session whose shell has already started;
- ``docker_exec``: ``docker exec <container> sh -c "echo hi"`` as a subprocess: what a sandbox
  that spawns a process per command pays.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import time
from typing import Any

import anyio
from _stats import summary

from orchestrator._api import Orchestrator
from orchestrator._core.config import OrchestratorConfig

LABELS = {"sandhold.bench": "terminal"}
COMMAND = "echo hi"
WARMUP_ROUNDS = 20


async def bench_shell_run(orch: Orchestrator, session_id: str, rounds: int) -> list[float]:
    arguments = {"operation": "run", "command": COMMAND, "session_id": session_id}

    async def step() -> None:
        result = await orch.call("terminal", arguments)
        assert result.structured["success"], result.structured
        assert result.structured["stdout"].strip() == "hi", result.structured

    for _ in range(WARMUP_ROUNDS):  # the first call starts the shell
        await step()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


def bench_docker_exec(container_id: str, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        done = subprocess.run(
            ["docker", "exec", container_id, "sh", "-c", COMMAND],
            check=True,
            timeout=60,
            capture_output=True,
        )
        samples.append(time.perf_counter() - started)
        assert done.stdout.strip() == b"hi", done
    return samples


async def main(rounds: int) -> None:
    load_average = round(os.getloadavg()[0], 1)
    config = OrchestratorConfig(
        orchestrator_id=f"bench-terminal-{secrets.token_hex(4)}", extra_labels=LABELS
    )
    async with Orchestrator(config) as orch:
        session = await orch.create_session()
        shell = await bench_shell_run(orch, session.id, rounds)
        exec_samples = await anyio.to_thread.run_sync(
            bench_docker_exec, session.container_id, max(rounds // 10, 20)
        )
    figures: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": load_average,
        },
        "shell_run": summary(shell),
        "docker_exec": summary(exec_samples),
    }
    figures["shell_run_vs_docker_exec_speedup"] = round(
        figures["docker_exec"]["p50_ms"] / figures["shell_run"]["p50_ms"], 1
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    anyio.run(main, parser.parse_args().rounds)
