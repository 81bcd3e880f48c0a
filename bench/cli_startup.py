"""``sandhold`` start-up as a person at a shell sees it, spawn to exit; prints JSON.

    .venv/bin/python bench/cli_startup.py [--rounds 20]

Each round spawns, one after the other: ``python -c pass`` (the baseline: the interpreter alone),
``sandhold --help``, ``sandhold ps``, ``sandhold kill <a session that does not exist>`` (it asks
the engine, finds nothing and says so) and ``sandhold policy check <a shipped policy file>``.
Rounds interleave the commands, so load from other work falls on all of them alike. The data
directory is a fresh temporary one (no registry, nothing to migrate); ``ps`` and ``kill`` only
read the engine. Target (issue 21): each command p50 ≤ 0.3 s of wall clock. Each command's CPU
time (user + system, from the children's rusage) is shown beside it: other work on the machine
stretches the wall clock, much less the CPU a command spends.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator._resources import shipped_policies_dir

TARGET_S = 0.3
# A command that has not ended by then is hung, not slow.
RUN_TIMEOUT = 60.0
WARM_UP_ROUNDS = 2


def sandhold() -> list[str]:
    """The console script beside this interpreter, as a user runs it."""
    script = Path(sys.executable).parent / "sandhold"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "orchestrator.cli"]


def commands() -> dict[str, tuple[list[str], int]]:
    """Name -> (argv, the exit status it must end with)."""
    cli = sandhold()
    policy = shipped_policies_dir() / "default.toml"
    # Never a session id anyone has: the kill finds nothing (exit 2, session_not_found).
    nobody = f"bench-none-{secrets.token_hex(6)}"
    return {
        "baseline": ([sys.executable, "-c", "pass"], 0),
        "help": ([*cli, "--help"], 0),
        "ps": ([*cli, "ps"], 0),
        "kill": ([*cli, "kill", nobody], 2),
        "policy_check": ([*cli, "policy", "check", str(policy)], 0),
    }


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(argv: list[str], status: int, env: dict[str, str]) -> tuple[float, float]:
    """Wall clock and CPU time of one run, in seconds."""
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=RUN_TIMEOUT, check=False)
    elapsed, spent = time.perf_counter() - started, children_cpu() - cpu
    if done.returncode != status:
        raise RuntimeError(
            f"{argv}: exit {done.returncode}, expected {status}: {done.stderr.decode()[-500:]}"
        )
    return elapsed, spent


def figures(samples_s: list[float], cpu_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[max(int(len(ms) * 0.95 + 0.5) - 1, 0)], 1),
        "min_ms": round(ms[0], 1),
        "cpu_p50_ms": round(statistics.median(cpu_s) * 1000, 1),
    }


def main(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sandhold-bench-cli-") as data:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")},
            "SANDHOLD_DATA_DIR": data,
        }
        table = commands()
        samples: dict[str, list[float]] = {name: [] for name in table}
        cpu: dict[str, list[float]] = {name: [] for name in table}
        for index in range(WARM_UP_ROUNDS + rounds):
            for name, (argv, status) in table.items():
                seconds, spent = run_once(argv, status, env)
                if index >= WARM_UP_ROUNDS:
                    samples[name].append(seconds)
                    cpu[name].append(spent)
    baseline = figures(samples.pop("baseline"), cpu["baseline"])
    result: dict[str, Any] = {"baseline_python_pass": baseline}
    for name, values in samples.items():
        row = figures(values, cpu[name])
        row["p50_over_baseline_ms"] = round(row["p50_ms"] - baseline["p50_ms"], 1)
        row["meets_target"] = row["p50_ms"] <= TARGET_S * 1000
        result[name] = row
    result["target_p50_ms"] = TARGET_S * 1000
    result["meets_target"] = all(result[name]["meets_target"] for name in samples)
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    print(json.dumps(main(parser.parse_args().rounds), indent=2))
