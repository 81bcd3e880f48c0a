"""Every benchmark, one after the other, as one JSON document: ``{script: figures}``.

    .venv/bin/python bench/all.py

Each script runs as its own process (so one's memory and containers never colour another's) and
compares against its baseline within its own run; a script that fails is reported, not hidden.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = (
    "repl",
    "session_ready",
    "cold_start",
    "terminal",
    "files",
    "http_latency",
    "throughput",
    "density",
    "density_curve",
    "runtimes",
    "restart",
    "mcp_startup",
    "tool_list",
    "cli_startup",
    "e2b_sdk",
    "body_bombs",
)
# The longest one (density: 100 sessions) takes a few minutes on two cores.
SCRIPT_TIMEOUT = 1800


def run(name: str) -> object:
    result = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
    )
    if result.returncode != 0:
        return {"failed": result.returncode, "stderr": result.stderr[-2000:]}
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        return {"failed": "output is not JSON", "stdout": result.stdout[-2000:]}


def main() -> int:
    figures = {name: run(name) for name in SCRIPTS}
    print(json.dumps(figures, indent=2))
    failed = [name for name, f in figures.items() if isinstance(f, dict) and "failed" in f]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
