"""What ``sandhold serve`` offers the people who run it, against a real server: ``/metrics`` in
Prometheus's text format whose counters move with calls; ``/readyz`` naming what is not ready
(a missing image, an engine cut by ``tests.engine_proxy``) while ``/healthz`` stays live;
``--log-format json`` lines that parse, with the call id of the REST header and the audit log;
``sandhold tenant add`` making a key that serve accepts; ``--config`` validated and overridden
by flags; SIGHUP reloading tenants and policies while a live session goes on."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.streams.text import TextReceiveStream
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.images import ImageBuildResult
from tests.docker.test_serve import CALL_TIMEOUT, STOP_TIMEOUT, Server, running
from tests.engine_proxy import EngineProxy

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def local_key(notice: str) -> str:
    return notice.rsplit(": ", 1)[1]


async def stop(server: Server) -> None:
    """SIGTERM, so the server removes its sessions (a kill would leave them for the sweep)."""
    server.process.send_signal(signal.SIGTERM)
    with anyio.fail_after(STOP_TIMEOUT):
        await server.process.wait()


async def scrape(http: httpx.AsyncClient, headers: dict[str, str]) -> Samples:
    with anyio.fail_after(CALL_TIMEOUT):
        answer = await http.get("/metrics", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(answer.text)


async def test_metrics_parse_and_their_counters_move_with_calls(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        headers = {"Authorization": f"Bearer {local_key(server.notice)}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            assert (await http.get("/metrics")).status_code == 401
            before = await scrape(http, headers)
            with anyio.fail_after(CALL_TIMEOUT):
                made = await http.post(
                    "/v1/sessions", json={"code": "sum(range(10**6))"}, headers=headers
                )
                session_id = made.json()["session_id"]
                await http.post(
                    f"/v1/sessions/{session_id}/execute", json={"code": "1/0"}, headers=headers
                )
                await http.post("/v1/python_repl", json={"operation": "no-such"}, headers=headers)
            after = await scrape(http, headers)
        await stop(server)

        calls = "sandhold_calls_total"
        execute = {"tool": "python_repl", "operation": "execute"}
        assert (
            value(after, calls, **execute, outcome="ok")
            == value(before, calls, **execute, outcome="ok") + 1
        )
        # The user's ZeroDivisionError is the work failing, not the call.
        assert value(after, calls, **execute, outcome="failed") == 1
        refused = {"tool": "python_repl", "operation": "unknown", "outcome": "invalid_argument"}
        assert value(after, calls, **refused) == 1
        durations = "sandhold_call_duration_seconds_count"
        assert value(after, durations, **execute) == value(before, durations, **execute) + 2
        live = {"state": "idle", "tenant": "local", "policy": "default"}
        assert value(before, "sandhold_sessions", **live) == 0
        assert value(after, "sandhold_sessions", **live) == 1
        # The unauthenticated scrape above was counted as a failed authentication.
        assert value(after, "sandhold_auth_failures_total", reason="unauthenticated") == 1


async def readyz(http: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    with anyio.fail_after(CALL_TIMEOUT):
        answer = await http.get("/readyz")  # no key: a load balancer's probe has none
    return answer.status_code, answer.json()


async def test_readyz_is_200_when_engine_image_and_registry_are_ready(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            status, body = await readyz(http)
        await stop(server)
    assert status == 200, body
    assert body == {
        "ready": True,
        "not_ready": [],
        "checks": {"engine": "ok", "image": "ok", "registry": "ok"},
    }


async def test_readyz_names_a_missing_image_while_healthz_stays_ok(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    missing = f"sandhold-worker:missing-{secrets.token_hex(6)}"
    async with running(missing, tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            status, body = await readyz(http)
            alive = await http.get("/healthz")
        await stop(server)
    assert status == 503
    assert body["not_ready"] == ["image"] and missing in body["checks"]["image"]
    assert alive.status_code == 200


async def test_readyz_is_503_naming_the_engine_while_it_is_cut_and_200_once_it_is_back(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EngineProxy() as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.docker_host)
        async with running(worker_image.tag, tmp_path) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
                assert (await readyz(http))[0] == 200
                engine.cut()
                try:
                    status, body = await readyz(http)
                    alive = await http.get("/healthz")
                finally:
                    engine.restore()
                back, _ = await readyz(http)
            await stop(server)
    assert status == 503
    assert body["ready"] is False and body["not_ready"] == ["engine", "image"]
    assert body["checks"]["engine"].startswith("backend_unavailable: ")
    assert body["checks"]["registry"] == "ok"
    assert alive.status_code == 200 and back == 200


async def test_json_logs_parse_line_by_line_and_share_the_call_id_with_header_and_audit(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit_dir = tmp_path / "audit"
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(audit_dir))
    async with running(worker_image.tag, tmp_path, "--log-format", "json") as server:
        headers = {"Authorization": f"Bearer {local_key(server.notice)}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            with anyio.fail_after(CALL_TIMEOUT):
                made = await http.post("/v1/sessions", json={"code": "'x\\ny'"}, headers=headers)
                listed = await http.get("/v1/sessions", headers=headers)
        await stop(server)
    call_id = made.headers["x-sandhold-call-id"]
    assert len(call_id) == 16 and listed.headers["x-sandhold-call-id"] != call_id
    session_id = made.json()["session_id"]

    lines = (tmp_path / f"{server.orchestrator_id}.stderr").read_text().splitlines()
    events = [json.loads(line) for line in lines]  # every line is one JSON event
    assert all(
        {"time", "level", "event", "logger", "session", "tenant", "call_id"} <= e.keys()
        for e in events
    )
    (call,) = [e for e in events if e["call_id"] == call_id]
    assert call["logger"] == "orchestrator.calls" and call["level"] == "info"
    assert call["tenant"] == "local" and call["session"] == session_id
    assert (call["tool"], call["operation"], call["outcome"]) == ("python_repl", "execute", "ok")
    assert any(e["logger"] == "uvicorn.access" for e in events)

    records = [
        json.loads(line)
        for segment in sorted(audit_dir.glob("audit-*.jsonl"))
        for line in segment.read_text().splitlines()
    ]
    (audited,) = [r for r in records if r.get("call_id") == call_id and r["kind"] == "call"]
    assert audited["session_id"] == session_id and audited["operation"] == "execute"


def sandhold(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env=env, capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False,
    )  # fmt: skip


async def test_tenant_add_makes_a_key_that_serve_accepts_from_the_default_tenants_file(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    added = sandhold(
        data_dir, "tenant", "add", "ci-team", "--policies", "default", "--quota", "sessions=1"
    )
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key.startswith("sandhold_") and len(key.splitlines()) == 1
    assert key not in (data_dir / "tenants.toml").read_text()
    listed = sandhold(data_dir, "tenant", "list", "--json")
    assert json.loads(listed.stdout) == [
        {
            "name": "ci-team",
            "policies": ["default"],
            "quotas": {"sessions": 1},
            "egress_allow": None,
        }
    ]
    assert key not in listed.stdout and "key_sha256" not in listed.stdout

    async with running(worker_image.tag, tmp_path, data_dir=data_dir) as server:
        assert "1 tenant(s) from" in server.notice and "tenants.toml" in server.notice
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            with anyio.fail_after(CALL_TIMEOUT):
                made = await http.post(
                    "/v1/sessions",
                    json={"code": "1 + 1"},
                    headers={"Authorization": f"Bearer {key}"},
                )
                wrong = await http.get("/v1/sessions", headers={"Authorization": f"Bearer {key}x"})
        await stop(server)
    assert made.status_code == 200 and made.json()["result_repr"] == "2", made.text
    assert wrong.status_code == 401
    assert not (data_dir / "api-key").exists()  # no local tenant beside a tenants file


async def test_an_operator_added_by_the_cli_reads_metrics_and_every_tenant_a_tenant_cannot(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    tenant = sandhold(data_dir, "tenant", "add", "team-a").stdout.strip()
    added = sandhold(data_dir, "tenant", "add", "ops", "--operator")
    assert added.returncode == 0, added.stderr
    operator = added.stdout.strip()
    listed = json.loads(sandhold(data_dir, "tenant", "list", "--json").stdout)
    assert {"name": "ops", "operator": True} in listed
    async with running(worker_image.tag, tmp_path, data_dir=data_dir) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            as_tenant = {"Authorization": f"Bearer {tenant}"}
            as_operator = {"Authorization": f"Bearer {operator}"}
            with anyio.fail_after(CALL_TIMEOUT):
                made = await http.post("/v1/sessions", json={"code": "1"}, headers=as_tenant)
                refused = await http.get("/metrics", headers=as_tenant)
                scraped = await http.get("/metrics", headers=as_operator)
                everyone = await http.get("/v1/ops/sessions", headers=as_operator)
                no_calls = await http.post("/v1/sessions", json={"code": "1"}, headers=as_operator)
        await stop(server)
    assert made.status_code == 200
    assert refused.status_code == 403 and refused.json()["rule"] == "role.operator"
    assert scraped.status_code == 200 and 'tenant="team-a"' in scraped.text
    assert [s["tenant"] for s in everyone.json()["sessions"]] == ["team-a"]
    assert no_calls.status_code == 403 and no_calls.json()["rule"] == "role.tenant"


def test_tenant_add_refuses_an_unknown_quota_and_a_second_tenant_of_one_name(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    typo = sandhold(data_dir, "tenant", "add", "ci", "--quota", "sesions=1")
    assert typo.returncode == 2 and typo.stderr.startswith("error: invalid_argument: ")
    assert "sesions" in typo.stderr and not (data_dir / "tenants.toml").exists()
    assert sandhold(data_dir, "tenant", "add", "ci").returncode == 0
    again = sandhold(data_dir, "tenant", "add", "ci")
    assert again.returncode == 2 and again.stdout == ""


SERVE_COMMAND = [sys.executable, "-m", "orchestrator.cli", "serve"]


def test_a_config_file_with_a_mistyped_key_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "sandhold.toml"
    config.write_text('host = "127.0.0.1"\nprot = 8080\n')
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [*SERVE_COMMAND, "--config", str(config)],
        env=env, capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: invalid_argument: {config}: prot: ")
    assert not (tmp_path / "data").exists()


async def test_a_flag_overrides_the_config_file_and_the_file_sets_the_rest(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = tmp_path / "sandhold.toml"
        config.write_text(f'port = {port}\nlog_format = "json"\nmax_sessions = 1\n')
        env = {**os.environ, "SANDHOLD_DATA_DIR": str(tmp_path / "d")}
        with anyio.fail_after(CALL_TIMEOUT):
            refused = await anyio.run_process(
                [*SERVE_COMMAND, "--config", str(config)], env=env, check=False
            )
        assert refused.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port}" in refused.stderr.decode()
        # ``running`` passes --port 0: the flag wins over the file's port.
        async with running(worker_image.tag, tmp_path, "--config", str(config)) as server:
            headers = {"Authorization": f"Bearer {local_key(server.notice)}"}
            async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
                with anyio.fail_after(CALL_TIMEOUT):
                    first = await http.post("/v1/sessions", json={"code": "1"}, headers=headers)
                    await http.post("/v1/sessions", json={"code": "2"}, headers=headers)
                    path = f"/v1/sessions/{first.json()['session_id']}/execute"
                    evicted = await http.post(path, json={"code": "3"}, headers=headers)
            await stop(server)
    # The file's max_sessions (1: the second create ended the first) and log format are in force.
    assert evicted.status_code == 404, evicted.text
    lines = (tmp_path / f"{server.orchestrator_id}.stderr").read_text().splitlines()
    assert lines and all(json.loads(line)["logger"] for line in lines)


async def reloaded(server: Server) -> str:
    """SIGHUP, then the line the server prints once the reload is done (uvicorn's access lines
    go to stdout too, in text mode)."""
    assert server.process.stdout is not None
    server.process.send_signal(signal.SIGHUP)
    text = ""
    with anyio.fail_after(CALL_TIMEOUT):
        async for chunk in TextReceiveStream(server.process.stdout):
            text += chunk
            ours = [
                line for line in text.splitlines(keepends=True) if line.startswith("sandhold: ")
            ]
            if ours and ours[0].endswith("\n"):
                return ours[0].strip()
    raise AssertionError(f"the server ended its output: {text!r}")


async def test_sighup_reloads_tenants_and_policies_and_a_live_session_survives(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    policy = tmp_path / "mine.toml"
    policy.write_text('extends = "default"\nname = "before"\n')
    first_key = sandhold(data_dir, "tenant", "add", "first").stdout.strip()
    async with running(
        worker_image.tag, tmp_path, "--policy", str(policy), data_dir=data_dir
    ) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:

            async def post(key: str, path: str, body: dict[str, Any]) -> httpx.Response:
                with anyio.fail_after(CALL_TIMEOUT):
                    return await http.post(
                        path, json=body, headers={"Authorization": f"Bearer {key}"}
                    )

            made = await post(first_key, "/v1/sessions", {"code": "x = 41"})
            session_id = made.json()["session_id"]
            second_key = sandhold(data_dir, "tenant", "add", "second").stdout.strip()
            policy.write_text('extends = "default"\nname = "after"\n')
            assert (await post(second_key, "/v1/sessions", {"code": "1"})).status_code == 401

            assert "reloaded policies and 2 tenant(s)" in await reloaded(server)
            theirs = await post(second_key, "/v1/sessions", {"code": "1"})
            assert theirs.status_code == 200, theirs.text
            ours = await post(first_key, f"/v1/sessions/{session_id}/execute", {"code": "x + 1"})
            assert ours.json()["result_repr"] == "42"  # the live session and its state survived
            listed = await post(second_key, "/v1/python_repl", {"operation": "list_sessions"})
            mine = await post(first_key, "/v1/python_repl", {"operation": "list_sessions"})
            assert [s["policy"] for s in listed.json()["sessions"]] == ["after"]
            assert [s["policy"] for s in mine.json()["sessions"]] == ["before"]

            rotated = sandhold(data_dir, "tenant", "rotate", "first").stdout.strip()
            assert "reloaded" in await reloaded(server)
            listing = {"operation": "list_sessions"}
            assert (await post(first_key, "/v1/python_repl", listing)).status_code == 401
            again = await post(rotated, f"/v1/sessions/{session_id}/execute", {"code": "x"})
            assert again.json()["result_repr"] == "41"

            # A tenants file that no longer validates is refused; the keys in use stay.
            (data_dir / "tenants.toml").write_text("[[tenant]]\nname = 1\n")
            assert "reload refused" in await reloaded(server)
            assert (await post(rotated, "/v1/python_repl", listing)).status_code == 200
        await stop(server)
