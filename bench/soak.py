"""Soak: mixed load from several tenants through REST, MCP and the E2B port of one ``sandhold
serve``, with faults injected at random times; prints what happened and exits non-zero when
anything leaked or a loss was not reported.

    sudo .venv/bin/python bench/soak.py --minutes 10 [--tenants 3] [--workers 2] [--seed N]

Runs against a private Docker engine of its own (``tests/faults/private_engine.py``: its own
dockerd and containerd; the machine's engine only builds and lends the worker image), so it
needs root. Each worker keeps one session and a counter in it (``n``): every execute adds one
and checks the answer, so a session silently reset (or silently lost) is caught. Faults, one
at a time: the engine restarted, the engine frozen (SIGSTOP, ``FREEZE_S``), ``kill -9`` of serve
(then started again on the same data directory), a REPL worker killed inside a session.

Printed (JSON): calls by interface and outcome, p50/p99 per operation outside fault windows,
each fault with its window, sessions lost (each must fall in a restart's window), state resets
(each must have been reported), leftovers after a clean stop (containers, networks, registry
rows: all 0), serve's RSS at start and end. Exit 1 on a leftover, an unexplained loss or reset,
an ``internal`` answer, a call unanswered outside a fault's window (a hang), or RSS growth past
10 % in one serve process. ``run_soak`` is the same against an engine the caller gives
(``tests/faults/test_soak.py`` runs it for two minutes in CI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import docker.errors
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator._core.tenants import hash_key, new_key
from orchestrator.backend.base import SANDBOX_UID
from orchestrator.backend.docker import DockerClient
from orchestrator.images import ensure_worker_image
from tests.faults.private_engine import (
    EGRESS_SUBNETS,
    UPSTREAM_NETWORK,
    PrivateEngine,
)

# A frozen engine for this long: past the server's engine-call timeout, so calls must end.
FREEZE_S = 15.0
# A fault's window runs from its start to this long after it ended: calls answered while the
# server catches up (re-adopting, first calls after a thaw) belong to the fault.
SETTLE_S = 20.0
# The first fault waits for warm-up; then one every so often.
FIRST_FAULT_S = 20.0
FAULT_EVERY_S = (30.0, 60.0)
CALL_TIMEOUT = 120.0
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
MAX_RSS_GROWTH = 0.10
# A serve process's memory is taken as its start once it has served this long (imports done,
# first sessions made).
RSS_AFTER_S = 30.0
FAULTS = ("engine_restart", "engine_freeze", "serve_kill9", "worker_kill")
# Kills, as the sandbox's own user (code in it could), every process whose command line holds
# argv[1]: the REPL worker.
KILLER = (
    "import os, sys\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        line = open(f'/proc/{p}/cmdline', 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if int(p) != os.getpid() and sys.argv[1].encode() in line:\n"
    "        os.kill(int(p), 9)\n"
)


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    e2b_url: str
    started: float
    rss_start: int | None = None


@dataclass
class Soak:
    engine: PrivateEngine
    root: Path
    image: str
    keys: dict[str, str]
    orchestrator_id: str
    extra_labels: str = ""
    server: Server | None = None
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    lost: list[tuple[float, str]] = field(default_factory=list)
    resets: list[tuple[float, bool]] = field(default_factory=list)
    reset_answers: list[dict[str, Any]] = field(default_factory=list)
    unanswered: list[tuple[float, str]] = field(default_factory=list)
    internal: list[dict[str, Any]] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    rss: list[tuple[int, int | None, int | None]] = field(default_factory=list)
    fault_active: bool = False

    # -- the server ---------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DOCKER_HOST": self.engine.docker_host,
            "SANDHOLD_IMAGE": self.image,
            "SANDHOLD_DATA_DIR": str(self.root / "data"),
            "SANDHOLD_AUDIT_DIR": str(self.root / "audit"),
            "SANDHOLD_ORCHESTRATOR_ID": self.orchestrator_id,
            "SANDHOLD_EGRESS_NETWORK": UPSTREAM_NETWORK,
            "SANDHOLD_EGRESS_SUBNETS": EGRESS_SUBNETS,
            "SANDHOLD_POOL": "0",
            **({"SANDHOLD_EXTRA_LABELS": self.extra_labels} if self.extra_labels else {}),
        }

    def start_server(self) -> None:
        tenants = str(self.root / "tenants.toml")
        command = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1",
                   "--port", "0", "--e2b-port", "0", "--tenants", tenants]  # fmt: skip
        stderr = (self.root / "serve.stderr").open("a")
        process = subprocess.Popen(
            command, env=self.env(), stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        seen = ""
        deadline = time.monotonic() + START_TIMEOUT
        assert process.stdout is not None
        while "E2B protocol on" not in seen:
            line = process.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start: {seen}")
            seen += line
        rest = re.search(r"listening on (http://127\.0\.0\.1:\d+)", seen)
        e2b = re.search(r"E2B protocol on (http://127\.0\.0\.1:\d+)", seen)
        if rest is None or e2b is None:
            raise RuntimeError(f"serve printed no address: {seen}")
        # Its output from here on is drained (a full pipe would stall it).
        drain = subprocess.Popen(["cat"], stdin=process.stdout, stdout=subprocess.DEVNULL)
        del drain
        self.server = Server(process, rest.group(1), e2b.group(1), time.monotonic())

    def stop_server(self, *, kill: bool = False) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        self.rss.append((server.process.pid, server.rss_start, _rss(server.process.pid)))
        server.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        server.process.wait(STOP_TIMEOUT)

    # -- one call -----------------------------------------------------------------------------

    def record(self, interface: str, op: str, answer: dict[str, Any] | None, took: float) -> None:
        outcome = "no_answer" if answer is None else (
            "ok" if answer.get("success") else str(answer.get("error_type")))  # fmt: skip
        self.calls[(interface, outcome)] += 1
        if answer is None:
            self.unanswered.append((time.time(), f"{interface}.{op}"))
        if answer is not None and answer.get("error_type") == "internal":
            self.internal.append(answer)
        if not self.fault_active and outcome == "ok":
            self.latencies[f"{interface}.{op}"].append(took)

    def reset(self, call: Any, sid: str, answer: dict[str, Any], *, reported: bool) -> None:
        """A session whose counter was not what its calls made it."""
        at = time.time()
        self.resets.append((at, reported))
        self.reset_answers.append({
            "at": round(at, 1), "interface": call.__name__.strip("_"), "session": sid,
            "reported": reported, "error_type": answer.get("error_type"),
            "result_repr": answer.get("result_repr"), "state_reset": answer.get("state_reset"),
        })  # fmt: skip

    def in_window(self, at: float, kinds: tuple[str, ...]) -> bool:
        return any(k in kinds and start <= at <= end + SETTLE_S for k, start, end in self.windows)


async def _rest(soak: Soak, key: str, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
    server = soak.server
    if server is None:
        return None
    started = time.monotonic()
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as http:
                response = await http.post(
                    f"{server.url}/v1/{tool}", json=args, headers={"Authorization": f"Bearer {key}"}
                )
        answer: dict[str, Any] | None = response.json()
    except (httpx.HTTPError, TimeoutError, ValueError):
        answer = None
    soak.record("rest", f"{tool}.{args.get('operation')}", answer, time.monotonic() - started)
    return answer


async def _mcp(soak: Soak, key: str, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """One MCP tools/call over streamable HTTP, as a client without a session would make it."""
    server = soak.server
    if server is None:
        return None
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18"}  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}  # fmt: skip
    answer: dict[str, Any] | None = None
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as http:
                response = await http.post(f"{server.url}/mcp", json=body, headers=headers)
        answer = _mcp_result(response.text)
    except (httpx.HTTPError, TimeoutError, ValueError, IndexError, AttributeError):
        answer = None
    soak.record("mcp", f"{tool}.{args.get('operation')}", answer, time.monotonic() - started)
    return answer


def _mcp_result(text: str) -> dict[str, Any] | None:
    """The structured result of request 1 in a JSON body or an event stream: a long call's
    stream carries notifications (progress, logs) before it."""
    lines = text.splitlines()
    payloads = [line[5:].strip() for line in lines if line.startswith("data:")] or [text]
    for payload in payloads:
        message = json.loads(payload)
        if isinstance(message, dict) and message.get("id") == 1 and "result" in message:
            result: dict[str, Any] | None = message["result"].get("structuredContent")
            return result
    return None


async def _e2b_round(soak: Soak, key: str) -> None:
    """A sandbox made and ended through E2B's control API."""
    server = soak.server
    if server is None:
        return
    started = time.monotonic()
    headers = {"X-API-Key": key}
    outcome: dict[str, Any] | None = None
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            async with httpx.AsyncClient(base_url=server.e2b_url, timeout=CALL_TIMEOUT) as http:
                made = await http.post(
                    "/sandboxes", json={"templateID": "default"}, headers=headers
                )
                if made.status_code in (200, 201):
                    sandbox = made.json()["sandboxID"]
                    gone = await http.delete(f"/sandboxes/{sandbox}", headers=headers)
                    outcome = {"success": gone.status_code in (200, 204)}
                    if not outcome["success"]:
                        outcome["error_type"] = f"http_{gone.status_code}"
                else:
                    outcome = {"success": False, "error_type": f"http_{made.status_code}"}
    except (httpx.HTTPError, TimeoutError, ValueError, KeyError):
        outcome = None
    soak.record("e2b", "create_kill", outcome, time.monotonic() - started)


async def _worker(soak: Soak, tenant: str, key: str, deadline: float, rng: random.Random) -> None:
    """One session at a time with a counter in it; every answer about it checked."""
    sid: str | None = None
    expected = 0
    # The counter is gone (a reported reset) until a call sets it again: a NameError before
    # then is the soak's own doing, not a reset.
    unset = told = False
    while time.monotonic() < deadline:
        if soak.server is None:
            await anyio.sleep(0.5)
            continue
        call = _mcp if rng.random() < 0.3 else _rest
        if sid is None:
            made = await call(soak, key, "python_repl", {"operation": "execute", "code": "n = 0"})
            if made and made.get("success"):
                sid, expected, unset, told = made["session_id"], 0, False, False
                soak.sessions.add(sid)
            else:
                await anyio.sleep(1.0)
            continue
        if unset:
            args = {"operation": "execute", "session_id": sid, "code": "n = 0"}
            answer = await call(soak, key, "python_repl", args)
            if answer and answer.get("success"):
                expected, unset = 0, False
            sid = _after(soak, sid, answer)
            continue
        roll = rng.random()
        if roll < 0.5:
            args = {"operation": "execute", "session_id": sid, "code": "n += 1\nn"}
            answer = await call(soak, key, "python_repl", args)
            # A reset said by an answer that did not show it (a cell's timeout, say) counts as
            # said for the next answer that does.
            told = told or bool(answer and answer.get("state_reset"))
            if answer and answer.get("success"):
                got = int(answer["result_repr"])
                if got not in (expected + 1, expected + 2):  # +2: an unanswered call ran
                    soak.reset(call, sid, answer, reported=told)
                expected, told = got, False
            elif answer and answer.get("error_type") == "NameError":
                # n is gone: the answer itself must say the state was reset (a worker killed
                # while idle is found by this call, which runs in a fresh one).
                soak.reset(call, sid, answer, reported=told)
                unset, told = True, False
            elif answer and answer.get("error_type") == "process_crashed":
                soak.reset(call, sid, answer, reported=True)
                unset, told = True, False
            sid = _after(soak, sid, answer)
        elif roll < 0.65:
            shell = {"operation": "run", "session_id": sid, "command": "echo hi"}
            answer = await call(soak, key, "terminal", shell)
            sid = _after(soak, sid, answer)
        elif roll < 0.8:
            write = {"operation": "write", "session_id": sid, "path": "f.txt", "content": "x"}
            answer = await call(soak, key, "files", write)
            if answer and answer.get("success"):
                read = {"operation": "read", "session_id": sid, "path": "f.txt"}
                answer = await call(soak, key, "files", read)
            sid = _after(soak, sid, answer)
        elif roll < 0.87:
            for op in ("pause", "resume"):
                answer = await call(soak, key, "session", {"operation": op, "session_id": sid})
                sid = _after(soak, sid, answer)
                if sid is None:
                    break
        elif roll < 0.94:
            await _e2b_round(soak, key)
        else:
            await call(soak, key, "python_repl", {"operation": "destroy", "session_id": sid})
            soak.sessions.discard(sid)
            sid = None


def _after(soak: Soak, sid: str | None, answer: dict[str, Any] | None) -> str | None:
    """The worker's session after an answer: gone when it said so (a loss is recorded)."""
    if answer is None or answer.get("success"):
        return sid
    if answer.get("error_type") in ("session_lost", "session_not_found"):
        soak.lost.append((time.time(), str(answer.get("error_type"))))
        soak.sessions.discard(sid or "")
        return None
    return sid


async def _faults(soak: Soak, deadline: float, rng: random.Random) -> None:
    await anyio.sleep(FIRST_FAULT_S)
    while time.monotonic() + FREEZE_S + SETTLE_S < deadline:
        kind = rng.choice(FAULTS)
        start = time.time()
        soak.fault_active = True
        await anyio.to_thread.run_sync(_inject, soak, kind, rng)
        soak.windows.append((kind, start, time.time()))
        await anyio.sleep(SETTLE_S)
        soak.fault_active = False
        await anyio.sleep(rng.uniform(*FAULT_EVERY_S))


def _inject(soak: Soak, kind: str, rng: random.Random) -> None:
    if kind == "engine_restart":
        soak.engine.restart()
    elif kind == "engine_freeze":
        soak.engine.freeze()
        time.sleep(FREEZE_S)
        soak.engine.thaw()
    elif kind == "serve_kill9":
        soak.stop_server(kill=True)
        soak.start_server()
    elif kind == "worker_kill":
        client = soak.engine.client()
        try:
            label = f"sandhold.orchestrator={soak.orchestrator_id}"
            found = client.api.containers(filters={"label": label, "status": "running"})
            sessions = [c for c in found if "sandhold.egress-session" not in c["Labels"]]
            if sessions:
                victim = rng.choice(sessions)["Id"]
                # It may be paused or gone by now: then this fault did nothing.
                with contextlib.suppress(docker.errors.APIError):
                    client.containers.get(victim).exec_run(
                        ["python3", "-c", KILLER, "repl_worker.py"], user=str(SANDBOX_UID)
                    )
        finally:
            client.close()


def _rss(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


async def _measure_rss(soak: Soak, deadline: float) -> None:
    """Each serve process's RSS once it has served a while (its start, for the growth check)."""
    while time.monotonic() < deadline:
        server = soak.server
        if (
            server is not None
            and server.rss_start is None
            and time.monotonic() - server.started > RSS_AFTER_S
        ):
            server.rss_start = _rss(server.process.pid)
        await anyio.sleep(1.0)


def _leftovers(soak: Soak) -> dict[str, int]:
    client = soak.engine.client()
    try:
        label = {"label": f"sandhold.orchestrator={soak.orchestrator_id}"}
        containers = client.api.containers(all=True, filters=label)
        networks = client.api.networks(filters=label)
    finally:
        client.close()
    rows = 0
    for registry in (soak.root / "data").rglob("*.db"):
        connection = sqlite3.connect(f"file:{registry}?mode=ro", uri=True)
        with contextlib.closing(connection) as db, contextlib.suppress(sqlite3.Error):
            rows += db.execute("SELECT count(*) FROM sessions").fetchone()[0]
    return {"containers": len(containers), "networks": len(networks), "registry_rows": rows}


async def run_soak(
    engine: PrivateEngine,
    image: str,
    root: Path,
    *,
    minutes: float,
    tenants: int = 3,
    workers: int = 2,
    seed: int | None = None,
    extra_labels: str = "",
) -> dict[str, Any]:
    """One soak of ``minutes`` against ``engine`` (up, ``image`` loaded in it), its data under
    ``root``: the report, ``passed`` among it. ``extra_labels`` (``k=v,...``) go on everything
    serve makes."""
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    keys = {f"tenant-{n}": new_key() for n in range(tenants)}
    (root / "tenants.toml").write_text("".join(
        f'[[tenant]]\nname = "{name}"\nkey_sha256 = "{hash_key(key)}"\n\n'
        for name, key in keys.items()
    ))  # fmt: skip
    soak = Soak(engine, root, image, keys, f"soak-{secrets.token_hex(4)}", extra_labels)
    soak.start_server()
    try:
        deadline = time.monotonic() + minutes * 60
        async with anyio.create_task_group() as tg:
            tg.start_soon(_faults, soak, deadline, rng)
            tg.start_soon(_measure_rss, soak, deadline)
            for tenant, key in keys.items():
                for _ in range(workers):
                    worker_rng = random.Random(rng.random())
                    tg.start_soon(_worker, soak, tenant, key, deadline, worker_rng)
    finally:
        soak.stop_server()
    return {"seed": seed, "minutes": minutes, **_report(soak, _leftovers(soak))}


async def run(args: argparse.Namespace) -> int:
    client = DockerClient()
    try:
        image = (await ensure_worker_image(client)).tag
    finally:
        await client.aclose()
    root = Path(tempfile.mkdtemp(prefix="sandhold-soak-"))
    with PrivateEngine() as engine:
        engine.load_image(image)
        report = await run_soak(
            engine, image, root, minutes=args.minutes, tenants=args.tenants,
            workers=args.workers, seed=args.seed,
        )  # fmt: skip
    print(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


def _report(soak: Soak, leftovers: dict[str, int]) -> dict[str, Any]:
    unexplained_losses = [
        at for at, kind in soak.lost
        if kind != "session_lost" or not soak.in_window(at, ("engine_restart", "serve_kill9"))
    ]  # fmt: skip
    unreported_resets = [at for at, reported in soak.resets if not reported]
    # A call with no answer is one a kill -9 cut, or one that hung (its client gave up after
    # CALL_TIMEOUT): only the first may happen, and only in a fault's window.
    hung = [(round(at, 1), op) for at, op in soak.unanswered if not soak.in_window(at, FAULTS)]
    growth = [
        (end - start) / start for _, start, end in soak.rss if start and end
    ]  # fmt: skip
    problems = {
        "leftovers": {k: v for k, v in leftovers.items() if v},
        "losses_outside_a_restart_or_not_session_lost": len(unexplained_losses),
        "resets_not_reported": len(unreported_resets),
        "unanswered_outside_a_fault": hung,
        "internal_answers": len(soak.internal),
        "rss_growth_past_10_percent": [g for g in growth if g > MAX_RSS_GROWTH],
    }
    return {
        "calls": {f"{i}.{o}": n for (i, o), n in sorted(soak.calls.items())},
        "latency_outside_faults_ms": {
            op: _percentiles(samples) for op, samples in sorted(soak.latencies.items())
        },
        "faults": [{"kind": k, "start": s, "seconds": round(e - s, 1)} for k, s, e in soak.windows],
        "internal": soak.internal[:10],
        "sessions_lost": len(soak.lost),
        "state_resets": len(soak.resets),
        "resets": soak.reset_answers[:20],
        "leftovers": leftovers,
        "serve_rss_mb": [
            {"pid": pid, "start": _mb(start), "end": _mb(end)} for pid, start, end in soak.rss
        ],
        "problems": problems,
        "passed": not any(problems.values()),
    }


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in samples)
    return {
        "n": len(ms),
        "p50": round(ms[len(ms) // 2], 1),
        "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
    }


def _mb(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="sessions at work per tenant")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    if not 0 < args.minutes <= 24 * 60:
        parser.error("--minutes must be in (0, 1440]")
    sys.exit(anyio.run(run, args))


if __name__ == "__main__":
    main()
