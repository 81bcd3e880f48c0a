"""E2B's SDK against sandhold's own API, both against one real ``sandhold serve --e2b-port``, in
the same run; prints JSON.

    .venv/bin/python bench/e2b_sdk.py [--rounds 100] [--creates 5]

- ``create_to_first_command``: E2B's ``Sandbox.create()`` (template ``base``) to the answer of
  its first ``commands.run("echo 1")``, against sandhold's ``Sandbox.create(policy="shell")``
  (the policy ``base`` maps onto) and its ``commands.run("echo 1")``, remote over REST;
- ``create_to_first_run_code``: ``e2b_code_interpreter.Sandbox.create()`` (template
  ``code-interpreter-v1``) to its first ``run_code("1+1")``, against sandhold's
  ``Sandbox.create(policy="python-data")`` and ``run_code("1+1")``;
- ``commands_run_echo`` and ``run_code_1p1``: the same calls on a sandbox that exists;
  sandhold's ``commands.run`` is ``terminal`` ``run`` in the session's persistent shell, and
  with a ``cwd`` a process of its own (``terminal`` ``start`` + ``wait``, what the E2B front
  does for every command: ``sandhold_new_process``);
- ``overhead_ms``: each E2B p50 minus sandhold's.

The server runs with ``--pool 0``: every create, either way, is a cold container. Creates
alternate between the two clients, so a load change on the machine falls on both. The first
create of each template is a warm-up, not timed (``python-data`` may be built then).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _stats import summary

from orchestrator import Sandbox as SandholdSandbox
from orchestrator._core.tenants import hash_key

LABEL = "sandhold.bench=e2b"
# Start-up includes building the worker image when it is missing.
STARTUP_TIMEOUT = 600
STOP_TIMEOUT = 60
# A create of python-data the first time builds that template (about a minute or more).
CREATE_TIMEOUT = 900


def _read_urls(process: subprocess.Popen[str]) -> tuple[str, str]:
    """The main and the E2B address from serve's start-up lines, read in a thread so the wait
    is bounded."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            if "E2B protocol on" in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(STARTUP_TIMEOUT):
        raise SystemExit(f"sandhold serve gave no E2B address: {''.join(seen)}")
    text = "".join(seen)
    main = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
    e2b = re.search(r"E2B protocol on (http://127\.0\.0\.1:\d+)", text)
    assert main, text
    assert e2b, text
    return main.group(1), e2b.group(1)


@contextlib.contextmanager
def serving(tmp: Path, key: str) -> Iterator[tuple[str, str]]:
    tenants = tmp / "tenants.toml"
    tenants.write_text(f'[[tenant]]\nname = "bench"\nkey_sha256 = "{hash_key(key)}"\n')
    env = {
        **os.environ,
        "SANDHOLD_ORCHESTRATOR_ID": f"bench-e2b-{secrets.token_hex(4)}",
        "SANDHOLD_EXTRA_LABELS": LABEL,
        "SANDHOLD_DATA_DIR": str(tmp / "data"),
    }
    command = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1",
               "--port", "0", "--e2b-port", "0", "--pool", "0",
               "--tenants", str(tenants)]  # fmt: skip
    with (tmp / "serve.stderr").open("w") as stderr:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        try:
            yield _read_urls(process)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT)


def timed(rounds: int, once: Callable[[], Any]) -> dict[str, float]:
    once()  # warm: the first call of a sandbox pays for its setup
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        once()
        samples.append(time.perf_counter() - started)
    return summary(samples)


def create_rows(url: str, key: str, creates: int) -> dict[str, Any]:
    from e2b import Sandbox as E2bSandbox
    from e2b_code_interpreter import Sandbox as E2bCodeSandbox

    def e2b_command() -> float:
        started = time.perf_counter()
        box = E2bSandbox.create(request_timeout=CREATE_TIMEOUT)
        try:
            assert box.commands.run("echo 1").stdout == "1\n"
            return time.perf_counter() - started
        finally:
            box.kill()

    def e2b_code() -> float:
        started = time.perf_counter()
        box = E2bCodeSandbox.create(request_timeout=CREATE_TIMEOUT)
        try:
            assert box.run_code("1+1").text == "2"
            return time.perf_counter() - started
        finally:
            box.kill()

    def sandhold(policy: str, check: Callable[[Any], None]) -> Callable[[], float]:
        def once() -> float:
            started = time.perf_counter()
            with SandholdSandbox.create(policy=policy, url=url, api_key=key) as box:
                check(box)
                return time.perf_counter() - started

        return once

    def command(box: Any) -> None:
        assert box.commands.run("echo 1").stdout.strip() == "1"

    def code(box: Any) -> None:
        assert box.run_code("1+1").text == "2"

    pairs = {
        "create_to_first_command": (e2b_command, sandhold("shell", command)),
        "create_to_first_run_code": (e2b_code, sandhold("python-data", code)),
    }
    rows: dict[str, Any] = {}
    for name, (e2b_once, sandhold_once) in pairs.items():
        e2b_once(), sandhold_once()  # warm-up: the template built if missing, caches filled
        e2b_samples, sandhold_samples = [], []
        for _ in range(creates):
            e2b_samples.append(e2b_once())
            sandhold_samples.append(sandhold_once())
        rows[name] = {"e2b_sdk": summary(e2b_samples), "sandhold": summary(sandhold_samples)}
    return rows


def existing_rows(url: str, key: str, rounds: int) -> dict[str, Any]:
    from e2b_code_interpreter import Sandbox as E2bCodeSandbox

    e2b = E2bCodeSandbox.create(request_timeout=CREATE_TIMEOUT)
    try:
        with SandholdSandbox.create(policy="python-data", url=url, api_key=key) as box:
            return {
                "commands_run_echo": {
                    "e2b_sdk": timed(rounds, lambda: e2b.commands.run("echo 1")),
                    "sandhold": timed(rounds, lambda: box.commands.run("echo 1")),
                    # With a cwd, sandhold's commands.run starts a process of its own (terminal
                    # start + wait), as the E2B front does for every command.
                    "sandhold_new_process": timed(
                        rounds, lambda: box.commands.run("echo 1", cwd="/workspace")
                    ),
                },
                "run_code_1p1": {
                    "e2b_sdk": timed(rounds, lambda: e2b.run_code("1+1")),
                    "sandhold": timed(rounds, lambda: box.run_code("1+1")),
                },
            }
    finally:
        e2b.kill()


def main(rounds: int, creates: int) -> None:
    import e2b  # noqa: F401  (fails here, before a server starts, without the test extra)

    key = "e2b_" + secrets.token_hex(20)
    with tempfile.TemporaryDirectory(prefix="bench-e2b-") as tmp, serving(Path(tmp), key) as urls:
        url, e2b_url = urls
        os.environ.update(E2B_API_URL=e2b_url, E2B_SANDBOX_URL=e2b_url, E2B_API_KEY=key)
        created = create_rows(url, key, creates)
        existing = existing_rows(url, key, rounds)
    rows = created | existing
    from importlib.metadata import version

    figures = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "sdk": {"e2b": version("e2b"), "e2b-code-interpreter": version("e2b-code-interpreter")},
        **rows,
        "overhead_ms": {
            name: round(row["e2b_sdk"]["p50_ms"] - row["sandhold"]["p50_ms"], 3)
            for name, row in rows.items()
        },
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--creates", type=int, default=5)
    arguments = parser.parse_args()
    main(arguments.rounds, arguments.creates)
