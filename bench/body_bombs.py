"""Another tenant's latency while bodies built to hurt are sent to every body-taking route that
needs no sandbox; prints JSON.

    .venv/bin/python bench/body_bombs.py [--rounds 3]

A ``sandhold serve --e2b-port`` started for it with two tenants (``--pool 0``: no container is
made). Tenant A sends, ``--rounds`` times, to ``POST /v1/sessions``, ``POST /v1/python_repl``,
``POST /mcp`` and E2B's ``POST /sandboxes``: a 1 GiB gzip bomb (~1 MiB), a 100 MiB JSON body
streamed without a length, and a 150 MiB metadata value. Tenant B meanwhile calls
``GET /v1/sessions`` one after another. Figures: B's p50 idle (after a warm-up) and under the
attack, the server's RSS growth, and whether every attack was answered 413. The data plane's
routes (envd, the interpreter) take the same front door; tests/docker/test_front_door.py sends
them the same bodies. Target (issue 27): B's p50 under attack within 2x of idle.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

CLI = [sys.executable, "-m", "orchestrator.cli"]
STARTUP_TIMEOUT = 120
STOP_TIMEOUT = 60
CALL_TIMEOUT = 120
WARM_UP = 20
IDLE_ROUNDS = 100
BOMB_MIB = 1024
BIG_JSON = 100 << 20
BIG_METADATA = 150 << 20


def gzip_bomb() -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(deflate.compress(zeros) for _ in range(BOMB_MIB)) + deflate.flush()


def chunks(data: bytes, size: int = 1 << 20) -> Iterator[bytes]:
    view = memoryview(data)
    for at in range(0, len(data), size):
        yield bytes(view[at : at + size])


def start(tmp: Path) -> tuple[subprocess.Popen[str], str, str, dict[str, str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from orchestrator._core.tenants import hash_key, new_key

    keys = {"a": new_key(), "b": new_key()}
    (tmp / "tenants.toml").write_text(
        "".join(
            f'[[tenant]]\nname = "{n}"\nkey_sha256 = "{hash_key(k)}"\n' for n, k in keys.items()
        )
    )
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(tmp / "data"),
           "SANDHOLD_ORCHESTRATOR_ID": f"bench-bombs-{os.getpid()}"}  # fmt: skip
    process = subprocess.Popen(
        [*CLI, "serve", "--host", "127.0.0.1", "--port", "0", "--e2b-port", "0", "--pool", "0",
         "--tenants", str(tmp / "tenants.toml")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    seen, found = [], threading.Event()

    def read() -> None:  # for as long as it runs: a full stdout pipe would stop the server
        assert process.stdout is not None
        for line in process.stdout:
            if not found.is_set():
                seen.append(line)
                if "E2B protocol on" in line:
                    found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(STARTUP_TIMEOUT):
        process.kill()
        raise SystemExit(f"serve did not start: {''.join(seen)}")
    text = "".join(seen)
    rest = re.search(r"listening on (http://\S+:\d+)", text)
    e2b = re.search(r"E2B protocol on (http://\S+:\d+)", text)
    if rest is None or e2b is None:
        process.kill()
        raise SystemExit(f"serve's addresses not found: {text}")
    return process, rest.group(1), e2b.group(1), keys


def latencies(url: str, key: str, stop: threading.Event, rounds: int | None) -> list[float]:
    samples: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=CALL_TIMEOUT) as http:
        while not stop.is_set() and (rounds is None or len(samples) < rounds):
            began = time.perf_counter()
            http.get("/v1/sessions").raise_for_status()
            samples.append(time.perf_counter() - began)
    return samples


def attack(rest: str, e2b: str, key: str, rounds: int) -> list[int]:
    bomb = gzip_bomb()
    big = b'{"code": "' + b"a" * BIG_JSON + b'"}'
    meta = b'{"templateID": "base", "metadata": {"k": "' + b"m" * BIG_METADATA + b'"}}'
    bearer = {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
              "Accept": "application/json, text/event-stream"}  # fmt: skip
    targets = [
        (f"{rest}/v1/sessions", bearer),
        (f"{rest}/v1/python_repl", bearer),
        (f"{rest}/mcp", bearer),
        (f"{e2b}/sandboxes", {"X-API-Key": key}),
    ]
    statuses = []
    with httpx.Client(timeout=CALL_TIMEOUT) as http:
        for _ in range(rounds):
            for url, headers in targets:
                for body, extra in ((bomb, {"Content-Encoding": "gzip"}), (chunks(big), {}),
                                    (meta, {})):  # fmt: skip
                    statuses.append(
                        http.post(url, content=body, headers={**headers, **extra}).status_code
                    )
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        process, rest, e2b, keys = start(Path(tmp))
        try:
            latencies(rest, keys["b"], threading.Event(), WARM_UP)
            idle = latencies(rest, keys["b"], threading.Event(), IDLE_ROUNDS)
            server = psutil.Process(process.pid)
            rss = [server.memory_info().rss]
            stop, during = threading.Event(), []
            probe = threading.Thread(
                target=lambda: during.extend(latencies(rest, keys["b"], stop, None))
            )
            probe.start()
            began = time.perf_counter()
            statuses = attack(rest, e2b, keys["a"], args.rounds)
            seconds = time.perf_counter() - began
            rss.append(server.memory_info().rss)
            stop.set()
            probe.join(CALL_TIMEOUT)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(STOP_TIMEOUT)
    p50_idle, p50_during = statistics.median(idle), statistics.median(during)
    print(json.dumps({
        "attacks": len(statuses), "all_413": set(statuses) == {413},
        "attack_seconds": round(seconds, 1),
        "other_tenant_p50_ms_idle": round(p50_idle * 1000, 2),
        "other_tenant_p50_ms_attacked": round(p50_during * 1000, 2),
        "ratio": round(p50_during / p50_idle, 2), "samples_attacked": len(during),
        "server_rss_growth_mib": (rss[1] - rss[0]) >> 20,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
