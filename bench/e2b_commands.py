"""A command on a live sandbox: E2B's SDK against sandhold's own ``Sandbox``, both against one
real ``sandhold serve --e2b-port``, in the same run, calls interleaved so a change of load on
the machine falls on every row alike; prints JSON.

    .venv/bin/python bench/e2b_commands.py [--rounds 200]

- ``e2b_sdk``: ``commands.run("echo 1")`` through E2B's SDK (``e2b``, pinned in the test
  extra): E2B's ``/bin/bash -l -c``, started by the session's spawner (one long-lived helper in
  the sandbox, no exec per command), its stderr split from its stdout;
- ``sandhold_shell``: sandhold's ``commands.run("echo 1")``, the session's persistent shell,
  remote over REST (what the issue called a REPL call's cost);
- ``sandhold_process``: sandhold's ``commands.run("echo 1", cwd="/workspace")``, a process of
  its own (``terminal`` ``start`` + ``wait``), the path every E2B command takes;
- ``in_sandbox_bash_login``: ``bash -l -c 'echo 1'`` timed inside the sandbox by bash itself
  (the floor no server can go under).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _stats import summary
from e2b_sdk import serving

from orchestrator import Sandbox as SandholdSandbox

# One create of each kind; a cold container on a loaded machine takes seconds.
CREATE_TIMEOUT = 900
# Timing loops run inside the sandbox: enough runs that bash's own start-up shows its p50.
IN_SANDBOX_RUNS = 50


def in_sandbox_floor(box: Any) -> dict[str, float]:
    script = (
        f"for i in $(seq {IN_SANDBOX_RUNS}); do s=$(date +%s%N); bash -l -c 'echo 1' >/dev/null;"
        " e=$(date +%s%N); echo $(( (e - s) / 1000 )); done"
    )
    out = box.commands.run(script, timeout=300).stdout
    return summary([int(line) / 1e6 for line in out.split()])


def main(rounds: int) -> None:
    from e2b import Sandbox as E2bSandbox

    key = "e2b_" + secrets.token_hex(20)
    with tempfile.TemporaryDirectory(prefix="bench-e2b-") as tmp, serving(Path(tmp), key) as urls:
        url, e2b_url = urls
        os.environ.update(E2B_API_URL=e2b_url, E2B_SANDBOX_URL=e2b_url, E2B_API_KEY=key)
        e2b = E2bSandbox.create(request_timeout=CREATE_TIMEOUT)
        try:
            with SandholdSandbox.create(policy="shell", url=url, api_key=key) as box:
                calls: dict[str, Callable[[], Any]] = {
                    "e2b_sdk": lambda: e2b.commands.run("echo 1"),
                    "sandhold_shell": lambda: box.commands.run("echo 1"),
                    "sandhold_process": lambda: box.commands.run("echo 1", cwd="/workspace"),
                }
                samples: dict[str, list[float]] = {name: [] for name in calls}
                for call in calls.values():
                    call()  # warm: the first command of a sandbox starts its helpers
                for _ in range(rounds):
                    for name, call in calls.items():
                        started = time.perf_counter()
                        call()
                        samples[name].append(time.perf_counter() - started)
                rows = {name: summary(values) for name, values in samples.items()}
                rows["in_sandbox_bash_login"] = in_sandbox_floor(e2b)
        finally:
            e2b.kill()
    from importlib.metadata import version

    print(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {platform.python_version()}",
                "load_average": os.getloadavg(),
                "sdk": {"e2b": version("e2b")},
                "rounds": rounds,
                **rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    main(parser.parse_args().rounds)
