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
- ``in_sandbox_*``: what the commands of the rows above run inside the sandbox, timed there
  by bash itself (``floors``): the floor no server goes under; a row's p50 minus its floor is
  what the server and the spawner add.
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
from orchestrator.http.e2b._demux import new_marker, with_stderr_marked

# One create of each kind; a cold container on a loaded machine takes seconds.
CREATE_TIMEOUT = 900


def floors() -> dict[str, str]:
    """What each row's command runs inside the sandbox, given to ``bash -c`` as the terminal
    does: the floor of each row."""
    login = "/bin/bash -l -c 'echo 1'"
    return {
        "in_sandbox_bash": "echo 1",  # sandhold's own new process
        "in_sandbox_bash_login": login,  # E2B's login shell alone (/etc/profile runs id)
        # What an E2B command runs: E2B's bash -l, and sed marking its stderr.
        "in_sandbox_e2b_command": with_stderr_marked(login, new_marker()),
    }


def floor_script() -> str:
    """One run of each floor, timed inside the sandbox by bash: ``name microseconds`` lines."""
    lines = []
    for name, command in floors().items():
        lines += [
            f"IFS= read -r -d '' c <<'SANDHOLD_EOF'\n{command}\nSANDHOLD_EOF",
            f's=$(date +%s%N); bash -c "$c" >/dev/null; e=$(date +%s%N); '
            f"echo {name} $(( (e - s) / 1000 ))",
        ]
    return "\n".join(lines)


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
                script = floor_script()
                for _ in range(rounds):
                    for name, call in calls.items():
                        started = time.perf_counter()
                        call()
                        samples[name].append(time.perf_counter() - started)
                    # The floors in the same round, so they see the same load as the calls.
                    for line in e2b.commands.run(script).stdout.splitlines():
                        name, micros = line.split()
                        samples.setdefault(name, []).append(int(micros) / 1e6)
                rows = {name: summary(values) for name, values in samples.items()}
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
                # What the server and the spawner add over what the command costs in the sandbox.
                "overhead_p50_ms": {
                    "e2b_sdk": round(
                        rows["e2b_sdk"]["p50_ms"] - rows["in_sandbox_e2b_command"]["p50_ms"], 3
                    ),
                    "sandhold_process": round(
                        rows["sandhold_process"]["p50_ms"] - rows["in_sandbox_bash"]["p50_ms"], 3
                    ),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    main(parser.parse_args().rounds)
