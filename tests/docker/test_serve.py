"""``sandhold serve`` as a person runs it: a subprocess on a free loopback port, its printed address
and key, one execute with that key, and SIGTERM ending it in bounded time with no container
left. Bad start-up input fails at once with the one-line error and exit status 2."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.text import TextReceiveStream

from orchestrator._core.tenants import LOCAL_KEY_FILE, hash_key, new_key
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.docker.test_mcp_stdio import containers_of

# Start-up with the image present: a Docker ping and the interpreter's imports.
STARTUP_TIMEOUT = 60
# The server's graceful wait (5 s) plus the orchestrator's teardown of a session or two.
STOP_TIMEOUT = 60
CALL_TIMEOUT = 60
SERVE = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1", "--port", "0"]


@dataclass
class Server:
    process: anyio.abc.Process
    url: str
    notice: str
    orchestrator_id: str
    reconciled: str


def serve_env(image: str, data_dir: Path, orchestrator_id: str) -> dict[str, str]:
    return {
        **os.environ,
        "SANDHOLD_IMAGE": image,
        "SANDHOLD_ORCHESTRATOR_ID": orchestrator_id,
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
        "SANDHOLD_DATA_DIR": str(data_dir),
    }


@contextlib.asynccontextmanager
async def running(
    image: str,
    tmp_path: Path,
    *args: str,
    data_dir: Path | None = None,
    orchestrator_id: str | None = None,
) -> AsyncIterator[Server]:
    """``sandhold serve`` started and its start-up lines read; killed if a test leaves it up."""
    orchestrator_id = orchestrator_id or f"test-serve-{RUN_ID}-{secrets.token_hex(4)}"
    env = serve_env(image, data_dir or tmp_path / "data", orchestrator_id)
    with (tmp_path / f"{orchestrator_id}.stderr").open("wb") as stderr:
        process = await anyio.open_process(
            [*SERVE, *args], env=env, stdout=subprocess.PIPE, stderr=stderr
        )
        try:
            assert process.stdout is not None
            text = ""
            with anyio.fail_after(STARTUP_TIMEOUT):
                async for chunk in TextReceiveStream(process.stdout):
                    text += chunk
                    if len(re.findall(r"^sandhold: .*\n", text, re.MULTILINE)) >= 3:
                        break
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
            assert found, text
            notice = text.splitlines()[1]
            yield Server(process, found.group(1), notice, orchestrator_id, text.splitlines()[2])
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.move_on_after(STOP_TIMEOUT):
                    await process.wait()


@pytest.mark.docker
@pytest.mark.anyio
async def test_serve_answers_with_its_printed_key_and_stops_on_sigterm_leaving_nothing(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with running(worker_image.tag, tmp_path) as server:
        key = server.notice.rsplit(": ", 1)[1]
        assert "shown once" in server.notice
        assert (tmp_path / "data" / LOCAL_KEY_FILE).read_text().strip() == key
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert (await http.get("/v1/sessions")).status_code == 401
            with anyio.fail_after(CALL_TIMEOUT):
                done = await http.post("/v1/sessions", json={"code": "6 * 7"}, headers=headers)
        assert done.status_code == 200 and done.json()["result_repr"] == "42", done.text
        assert len(containers_of(server.orchestrator_id)) == 1

        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            code = await server.process.wait()
        assert code == 128 + signal.SIGTERM
        assert containers_of(server.orchestrator_id) == []


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_second_start_reuses_the_local_key_without_printing_it(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    for run in range(2):
        async with running(worker_image.tag, tmp_path, data_dir=data_dir) as server:
            key = (data_dir / LOCAL_KEY_FILE).read_text().strip()
            assert (key in server.notice) == (run == 0)
            async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
                headers = {"Authorization": f"Bearer {key}"}
                assert (await http.get("/v1/sessions", headers=headers)).status_code == 200
            server.process.send_signal(signal.SIGINT)
            with anyio.fail_after(STOP_TIMEOUT):
                assert await server.process.wait() == 128 + signal.SIGINT


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_tenants_file_gives_each_tenant_its_key(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    key = new_key()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        f'[[tenant]]\nname = "ops"\nkey_sha256 = "{hash_key(key)}"\n[tenant.quotas]\nsessions = 1\n'
    )
    async with running(worker_image.tag, tmp_path, "--tenants", str(tenants)) as server:
        assert "1 tenant(s)" in server.notice and key not in server.notice
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT) as http:
            listing = await http.get("/v1/sessions", headers=headers)
            assert listing.status_code == 200
            with anyio.fail_after(CALL_TIMEOUT):
                first = await http.post("/v1/sessions", json={"code": "1"}, headers=headers)
                second = await http.post("/v1/sessions", json={"code": "1"}, headers=headers)
        assert first.status_code == 200, first.text
        # The file's quota is the server's: one session for this tenant.
        assert second.status_code == 429
        assert second.json()["quota"] == "sessions", second.text
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
        # No local key is made beside a tenants file (the data directory holds the registry).
        assert not (tmp_path / "data" / LOCAL_KEY_FILE).exists()
        assert (tmp_path / "data" / "registry.db").exists()


def run_serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = serve_env("unused", tmp_path / "data", "unused")
    return subprocess.run(
        [*SERVE, *args], env=env, capture_output=True, text=True, timeout=STARTUP_TIMEOUT
    )


def test_a_bad_tenants_file_stops_the_start_with_its_file_and_key(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[[tenant]]\nname = "ops"\nkey_sha256 = "short"\n')
    done = run_serve(tmp_path, "--tenants", str(tenants))
    assert done.returncode == 2
    assert done.stderr.startswith("error: invalid_argument: ")
    assert str(tenants) in done.stderr and "tenant.0.key_sha256" in done.stderr


def test_a_port_in_use_stops_the_start_at_once(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        done = run_serve(tmp_path, "--port", port)
    assert done.returncode == 2
    assert done.stderr.startswith("error: invalid_argument: cannot listen on 127.0.0.1:")


def test_an_unknown_policy_stops_the_start_before_anything_is_made(tmp_path: Path) -> None:
    done = run_serve(tmp_path, "--policy", "no-such-policy")
    assert done.returncode == 2
    assert done.stderr.startswith("error: invalid_argument: ")
    assert not (tmp_path / "data").exists()
