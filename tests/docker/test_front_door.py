"""The front door every HTTP surface goes through, attacked on a real ``sandhold serve --e2b-port``
over loopback: on every surface (REST, ``/mcp``, E2B's control API, envd's ``/files`` and
Connect RPCs, the code interpreter) a 1 GB gzip bomb, a 150 MiB metadata value and a 100 MiB
JSON body are refused 413 while another tenant's requests keep their latency; an encoding not
taken is 415 and deep JSON 400; wrong E2B keys and tokens are 429 past the budget they share
with REST; E2B streams count against the tenant's stream limit; ``/metrics`` and the all-tenant
ops view need the operator's key; every route of every surface is behind the door."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest

from orchestrator._core.tenants import hash_key, new_key
from orchestrator.http._rest_surface import OPERATOR_PATHS
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL

pytestmark = pytest.mark.docker

STARTUP_TIMEOUT = 120
STOP_TIMEOUT = 60
CALL_TIMEOUT = 120
# The server's caps: a few for the budget so that the test reaches it fast, three streams.
AUTH_BUDGET = 5
MAX_STREAMS = 3
BOMB_DECODED = 1 << 30  # 1 GiB of zeros, ~1 MiB gzipped
BIG_JSON = 100 << 20
BIG_METADATA = 150 << 20
DEEP = 10_000
# A request's latency may double under attack; below this floor, doubling is noise.
LATENCY_FLOOR = 0.010
RSS_GROWTH_BOUND = 400 << 20


@dataclass
class Served:
    rest: str
    e2b: str
    keys: dict[str, str]
    pid: int


def _tenants_file(path: Path, keys: dict[str, str]) -> None:
    text = "".join(
        f'[[tenant]]\nname = "{name}"\nkey_sha256 = "{hash_key(key)}"\n\n'
        for name, key in keys.items()
        if name != "ops"
    )
    text += f'[[operator]]\nname = "ops"\nkey_sha256 = "{hash_key(keys["ops"])}"\n'
    path.write_text(text)


def _addresses(process: subprocess.Popen[str]) -> tuple[str, str]:
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        """Reads for as long as the server runs: its access log goes to stdout, and a full pipe
        would stop it."""
        assert process.stdout is not None
        for line in process.stdout:
            if not found.is_set():
                seen.append(line)
            if "E2B protocol on" in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(STARTUP_TIMEOUT):
        raise AssertionError(f"no E2B address within {STARTUP_TIMEOUT} s: {''.join(seen)}")
    text = "".join(seen)
    rest = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
    e2b = re.search(r"E2B protocol on (http://127\.0\.0\.1:\d+)", text)
    assert rest and e2b, text
    return rest.group(1), e2b.group(1)


@pytest.fixture(scope="module")
def served(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("front")
    keys = {"team-a": new_key(), "team-b": new_key(), "ops": new_key()}
    _tenants_file(tmp / "tenants.toml", keys)
    env = {
        **os.environ,
        "SANDHOLD_IMAGE": worker_image.tag,
        "SANDHOLD_ORCHESTRATOR_ID": f"test-front-{RUN_ID}-{secrets.token_hex(4)}",
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
        "SANDHOLD_DATA_DIR": str(tmp / "data"),
    }
    command = [
        sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1", "--port", "0",
        "--e2b-port", "0", "--tenants", str(tmp / "tenants.toml"), "--pool", "0",
        "--auth-failures-per-minute", str(AUTH_BUDGET),
        "--max-streams-per-tenant", str(MAX_STREAMS),
    ]  # fmt: skip
    with (tmp / "serve.stderr").open("w") as stderr:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        try:
            rest, e2b = _addresses(process)
            yield Served(rest, e2b, keys, process.pid)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT)


@dataclass
class Sandbox:
    sandbox_id: str
    token: str


@pytest.fixture(scope="module")
def sandbox(served: Served) -> Iterator[Sandbox]:
    headers = {"X-API-Key": served.keys["team-a"]}
    with httpx.Client(base_url=served.e2b, headers=headers, timeout=CALL_TIMEOUT) as http:
        made = http.post("/sandboxes", json={"templateID": "base", "timeout": 600})
        assert made.status_code == 201, made.text
        found = made.json()
        yield Sandbox(found["sandboxID"], found["envdAccessToken"])
        http.delete(f"/sandboxes/{found['sandboxID']}")


@dataclass(frozen=True)
class Target:
    """One surface's route taking a body, and how a request to it is made."""

    name: str
    url: str
    headers: dict[str, str]
    json: bool = True

    def refused_type(self, response: httpx.Response) -> str:
        return str(response.json()["error_type"])


def targets(served: Served, sandbox: Sandbox) -> list[Target]:
    a = served.keys["team-a"]
    bearer = {"Authorization": f"Bearer {a}", "Content-Type": "application/json"}
    mcp = {**bearer, "Accept": "application/json, text/event-stream"}
    data = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox.token,
        "Content-Type": "application/json",
    }
    return [
        Target("rest", f"{served.rest}/v1/sessions", bearer),
        Target("rest-tool", f"{served.rest}/v1/python_repl", bearer),
        Target("mcp", f"{served.rest}/mcp", mcp),
        Target("e2b-control", f"{served.e2b}/sandboxes", {"X-API-Key": a}),
        Target(
            "envd-files",
            f"{served.e2b}/files?path=up.bin",
            {**data, "Content-Type": "application/octet-stream"},
            json=False,
        ),
        Target("envd-rpc", f"{served.e2b}/filesystem.Filesystem/Stat", data),
        Target("interpreter", f"{served.e2b}/execute", {**data, "E2b-Sandbox-Port": "49999"}),
    ]


def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzipped as a stream (never held whole): about 1 MiB."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = [deflate.compress(zeros) for _ in range(BOMB_DECODED >> 20)]
    return b"".join(parts) + deflate.flush()


def _chunks(data: bytes, size: int = 1 << 20) -> Iterator[bytes]:
    view = memoryview(data)
    for at in range(0, len(data), size):
        yield bytes(view[at : at + size])


def _send(target: Target, body: Any, **headers: str) -> httpx.Response:
    with httpx.Client(timeout=CALL_TIMEOUT) as http:
        return http.post(target.url, content=body, headers={**target.headers, **headers})


def _attack(served: Served, sandbox: Sandbox, bomb: bytes, big: bytes, meta: bytes) -> list[Any]:
    """Every attack on every surface: (surface, attack, status, error_type)."""
    found = []
    for target in targets(served, sandbox):
        for attack, body, headers in (
            ("gzip-bomb", bomb, {"Content-Encoding": "gzip"}),
            ("json-100MiB-streamed", _chunks(big), {}),
            ("metadata-150MiB", meta, {}),
        ):
            response = _send(target, body, **headers)
            found.append((target.name, attack, response.status_code, target.refused_type(response)))
    return found


def _latencies(served: Served, stop: threading.Event, rounds: int | None = None) -> list[float]:
    """Another tenant's ``GET /v1/sessions``, one after another."""
    samples: list[float] = []
    headers = {"Authorization": f"Bearer {served.keys['team-b']}"}
    with httpx.Client(base_url=served.rest, headers=headers, timeout=CALL_TIMEOUT) as http:
        while not stop.is_set() and (rounds is None or len(samples) < rounds):
            started = time.perf_counter()
            assert http.get("/v1/sessions").status_code == 200
            samples.append(time.perf_counter() - started)
    return samples


def test_bombs_and_huge_bodies_are_refused_413_on_every_surface_while_others_are_served(
    served: Served, sandbox: Sandbox
) -> None:
    bomb = gzip_bomb()
    assert len(bomb) < 2 << 20
    big = b'{"code": "' + b"a" * BIG_JSON + b'"}'
    meta = b'{"templateID": "base", "metadata": {"k": "' + b"m" * BIG_METADATA + b'"}}'
    _latencies(served, threading.Event(), rounds=10)  # warm: the first calls pay for imports
    idle = _latencies(served, threading.Event(), rounds=30)
    server = psutil.Process(served.pid)
    rss_before = server.memory_info().rss
    stop, during, peak = threading.Event(), [], [rss_before]

    def probe() -> None:
        during.extend(_latencies(served, stop))

    def watch() -> None:
        while not stop.wait(0.05):
            peak.append(server.memory_info().rss)

    threads = [threading.Thread(target=probe), threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    try:
        refused = _attack(served, sandbox, bomb, big, meta)
    finally:
        stop.set()
        for thread in threads:
            thread.join(CALL_TIMEOUT)
    figures = {
        "idle_p50_ms": round(statistics.median(idle) * 1000, 2),
        "attacked_p50_ms": round(statistics.median(during) * 1000, 2),
        "samples_during": len(during),
        "rss_growth_mib": (max(peak) - rss_before) >> 20,
    }
    print(json.dumps(figures))
    assert [(name, attack, status) for name, attack, status, _ in refused] == [
        (name, attack, 413) for name, attack, _, _ in refused
    ], refused
    assert {error_type for *_, error_type in refused} == {"invalid_argument"}
    assert statistics.median(during) <= 2 * max(statistics.median(idle), LATENCY_FLOOR), figures
    assert max(peak) - rss_before < RSS_GROWTH_BOUND, figures


def test_an_encoding_not_taken_is_415_and_deep_json_400_on_every_surface(
    served: Served, sandbox: Sandbox
) -> None:
    deep = b"[" * DEEP + b"]" * DEEP
    for target in targets(served, sandbox):
        for coding in ("br", "zstd", "gzip, gzip, gzip"):
            response = _send(target, b"{}", **{"Content-Encoding": coding})
            assert response.status_code == 415, (target.name, coding, response.text)
            assert target.refused_type(response) == "invalid_argument"
        if target.json:
            response = _send(target, deep)
            assert response.status_code == 400, (target.name, response.text)
            assert "nested" in response.text
    rpc = targets(served, sandbox)[5]
    compressed = _send(rpc, b"{}", **{"Connect-Content-Encoding": "gzip"})
    assert compressed.status_code == 415


def test_a_gzipped_upload_within_the_cap_is_written_whole(served: Served, sandbox: Sandbox) -> None:
    data = secrets.token_bytes(1 << 20)
    files = targets(served, sandbox)[4]
    response = _send(files, zlib.compress(data, wbits=31), **{"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.text
    headers = {k: v for k, v in files.headers.items() if k != "Content-Type"}
    with httpx.Client(timeout=CALL_TIMEOUT) as http:
        back = http.get(f"{served.e2b}/files", params={"path": "up.bin"}, headers=headers)
        missing = http.get(f"{served.e2b}/files", params={"path": "none.bin"}, headers=headers)
        rest = http.post(
            f"{served.rest}/v1/files",
            json={"operation": "read", "path": "/workspace/none.bin", "session_id": "x" * 32},
            headers={"Authorization": f"Bearer {served.keys['team-a']}"},
        )
    assert back.content == data
    assert missing.status_code == 404
    assert rest.status_code == 404


def _wrong(url: str, address: str, headers: dict[str, str], rounds: int) -> list[int]:
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(transport=transport, timeout=CALL_TIMEOUT) as http:
        return [http.get(url, headers=headers).status_code for _ in range(rounds)]


def test_wrong_e2b_keys_and_tokens_are_429_past_the_budget_shared_with_rest(
    served: Served, sandbox: Sandbox
) -> None:
    wrong_key = {"X-API-Key": "e2b_" + secrets.token_hex(20)}
    statuses = _wrong(f"{served.e2b}/sandboxes", "127.0.0.7", wrong_key, 3 * AUTH_BUDGET)
    assert statuses[:AUTH_BUDGET] == [401] * AUTH_BUDGET
    assert statuses[-AUTH_BUDGET:] == [429] * AUTH_BUDGET
    # The same address is out of budget on the REST port too, and for a wrong token.
    rest = _wrong(f"{served.rest}/v1/sessions", "127.0.0.7", {"Authorization": "Bearer x"}, 1)
    token = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "wrong"}
    data = _wrong(f"{served.e2b}/health", "127.0.0.7", token, 1)
    assert rest == data == [429]
    # Another address has its own budget; a wrong token within it is E2B's "not found".
    assert _wrong(f"{served.e2b}/health", "127.0.0.8", token, 1) == [502]
    valid = {"X-API-Key": served.keys["team-a"]}
    assert _wrong(f"{served.e2b}/sandboxes", "127.0.0.7", valid, 1) == [200]


def _start_request(command: str) -> bytes:
    message = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}}).encode()
    return b"\x00" + len(message).to_bytes(4, "big") + message


@pytest.mark.anyio
async def test_e2b_command_streams_count_against_the_tenants_stream_limit(
    served: Served, sandbox: Sandbox
) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox.token,
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
    }
    url = f"{served.e2b}/process.Process/Start"
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT, headers=headers) as http:
        with anyio.fail_after(CALL_TIMEOUT):
            async with contextlib.AsyncExitStack() as stack:
                for _ in range(MAX_STREAMS):
                    held = await stack.enter_async_context(
                        http.stream("POST", url, content=_start_request("sleep 60"))
                    )
                    assert held.status_code == 200
                    await anext(held.aiter_bytes())  # its start event: the stream is open
                refused = await http.post(url, content=_start_request("true"))
                rest = await http.get(
                    f"{served.rest}/mcp",
                    headers={
                        "Authorization": f"Bearer {served.keys['team-a']}",
                        "Accept": "text/event-stream",
                    },
                )
    assert refused.status_code == 429, refused.text
    assert refused.json()["error_type"] == "quota_exceeded"
    assert refused.json()["quota"] == "streams"
    assert rest.status_code == 429  # one count for every surface of the tenant


def test_the_operator_key_reads_metrics_and_every_tenant_a_tenant_only_its_own(
    served: Served, sandbox: Sandbox
) -> None:
    def get(path: str, who: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {served.keys[who]}"}
        return httpx.get(f"{served.rest}{path}", headers=headers, timeout=CALL_TIMEOUT)

    assert get("/metrics", "team-a").status_code == 403
    assert get("/v1/ops/pools", "team-b").status_code == 403
    metrics = get("/metrics", "ops")
    assert metrics.status_code == 200 and "sandhold_" in metrics.text
    everyone = get("/v1/ops/sessions", "ops").json()
    assert everyone["operator"] is True
    assert "team-a" in {s["tenant"] for s in everyone["sessions"]}
    theirs = get("/v1/ops/sessions", "team-b").json()
    assert {s["tenant"] for s in theirs["sessions"]} <= {"team-b"}
    # The operator's key makes no tool calls, on either port.
    assert get("/v1/sessions", "ops").status_code == 403
    listed = httpx.get(
        f"{served.e2b}/sandboxes", headers={"X-API-Key": served.keys["ops"]}, timeout=CALL_TIMEOUT
    )
    assert listed.status_code == 403
    # Another tenant's sandbox answers like an unknown one.
    other = httpx.get(
        f"{served.e2b}/sandboxes/{sandbox.sandbox_id}",
        headers={"X-API-Key": served.keys["team-b"]},
        timeout=CALL_TIMEOUT,
    )
    unknown = httpx.get(
        f"{served.e2b}/sandboxes/{'z' * 20}",
        headers={"X-API-Key": served.keys["team-b"]},
        timeout=CALL_TIMEOUT,
    )
    assert other.status_code == unknown.status_code == 404


def test_e2b_metadata_is_bounded_and_listings_are_paginated(served: Served) -> None:
    headers = {"X-API-Key": served.keys["team-b"]}
    with httpx.Client(base_url=served.e2b, headers=headers, timeout=CALL_TIMEOUT) as http:
        big = http.post("/sandboxes", json={"templateID": "base", "metadata": {"k": "v" * 2048}})
        assert big.status_code == 400, big.text
        made = [
            http.post("/sandboxes", json={"templateID": "base", "metadata": {"page": "yes"}})
            for _ in range(2)
        ]
        try:
            assert [m.status_code for m in made] == [201, 201]
            query = {"metadata": "page=yes", "limit": "1"}
            first = http.get("/v2/sandboxes", params=query)
            token = first.headers["x-next-token"]
            second = http.get("/v2/sandboxes", params={**query, "nextToken": token})
            assert "x-next-token" not in second.headers
            ids = [s["sandboxID"] for s in first.json() + second.json()]
            assert sorted(ids) == sorted(m.json()["sandboxID"] for m in made)
            too_many = http.get("/v2/sandboxes", params={"limit": "1000"})
            assert too_many.status_code == 400
        finally:
            for m in made:
                http.delete(f"/sandboxes/{m.json()['sandboxID']}")


def _every_route(keys: dict[str, str]) -> list[tuple[str, str, str]]:
    """Every (surface, method, path) the server's two apps route, read from the apps as
    ``sandhold serve`` builds them: a route added later is listed here without a change."""
    from starlette.routing import Route

    from orchestrator._api import Orchestrator
    from orchestrator._core.config import OrchestratorConfig
    from orchestrator._core.tenants import TenantKeys
    from orchestrator.http import FrontDoor, build_app
    from orchestrator.http.e2b import build_e2b_app

    orchestrator = Orchestrator(OrchestratorConfig())  # built, never started: only routes read
    tenants = TenantKeys.single("team-a", keys["team-a"])
    rest, e2b = build_app(orchestrator, tenants), build_e2b_app(orchestrator, tenants)
    assert isinstance(rest, FrontDoor) and isinstance(e2b, FrontDoor)
    found: list[tuple[str, str, str]] = []

    def starlette(surface: str, routes: list[Any]) -> None:
        for route in routes:
            assert isinstance(route, Route), route
            path = re.sub(r"{(\w+)(:\w+)?}", "x", route.path)
            path = "/v1/python_repl" if route.path == "/v1/{tool}" else path
            found.extend((surface, m, path) for m in sorted(route.methods or ()) if m != "HEAD")

    inner: Any = rest.app
    while not hasattr(inner, "routes"):
        inner = inner.app
    starlette("rest", inner.routes)
    app: Any = e2b.app
    starlette("e2b-control", app.control.routes)
    starlette("envd", app.envd_http.routes)
    starlette("interpreter", app.interpreter.routes)
    for served_rpc in (app.process, app.filesystem):
        rpc = getattr(served_rpc, "wrapped", served_rpc)  # the process service is wrapped
        found.extend(("envd", "POST", path) for path in rpc._endpoints(rpc._service))
    return found


def test_every_route_of_every_surface_is_behind_the_front_door(
    served: Served, sandbox: Sandbox
) -> None:
    from orchestrator.cli._serving import _Server
    from orchestrator.http import HttpLimitsConfig

    # The server listens on its two ports and no other: the two apps below are all it serves.
    listening = {
        c.laddr.port
        for c in psutil.Process(served.pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening == {int(served.rest.rsplit(":", 1)[1]), int(served.e2b.rsplit(":", 1)[1])}
    with pytest.raises(TypeError, match="front door"):
        _Server(lambda scope, receive, send: None, limits=HttpLimitsConfig())
    data = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox.token}
    base = {
        "rest": (served.rest, {"Authorization": f"Bearer {served.keys['team-a']}"}),
        "e2b-control": (served.e2b, {"X-API-Key": served.keys["team-a"]}),
        "envd": (served.e2b, data),
        "interpreter": (served.e2b, {**data, "E2b-Sandbox-Port": "49999"}),
    }
    routes = _every_route(served.keys)
    assert len(routes) > 40, routes
    operator = {"Authorization": f"Bearer {served.keys['ops']}"}
    answers = {}
    with httpx.Client(timeout=CALL_TIMEOUT) as http:
        for surface, method, path in routes:
            url, headers = base[surface]
            if surface == "rest" and path in OPERATOR_PATHS:
                headers = operator
            response = http.request(
                method, url + path, content=b"{}", headers={**headers, "Content-Encoding": "br"}
            )
            answers[(surface, method, path)] = response.status_code
    assert {route: 415 for route in answers} == answers
