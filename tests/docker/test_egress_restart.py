"""``kill -9`` of a ``sandhold serve`` whose session has egress (the shipped ``pip`` policy):
the proxy and the session's network outlive the server, and the next start, which reaps the
session container it does not know, removes them with it. No traffic is made."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path

import anyio
import docker
import httpx
import pytest

from orchestrator._core.tenants import LOCAL_KEY_FILE
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID
from tests.docker.test_egress import _egress_of, own_upstream
from tests.docker.test_mcp_stdio import containers_of
from tests.docker.test_serve import CALL_TIMEOUT, STOP_TIMEOUT, running

pytestmark = [pytest.mark.docker, pytest.mark.anyio]
__all__ = ["own_upstream"]  # the fixture, from test_egress


async def test_after_kill_9_the_next_start_reaps_the_proxy_and_network_with_the_session(
    worker_image: ImageBuildResult,
    tmp_path: Path,
    own_upstream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDHOLD_EGRESS_NETWORK", own_upstream)  # read by serve_env
    data_dir = tmp_path / "data"
    first_id = f"test-egress-restart-{RUN_ID}-{secrets.token_hex(4)}"
    try:
        async with running(
            worker_image.tag, tmp_path, "--policy", "pip", data_dir=data_dir,
            orchestrator_id=first_id,
        ) as server:  # fmt: skip
            key = (data_dir / LOCAL_KEY_FILE).read_text().strip()
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(
                base_url=server.url, timeout=CALL_TIMEOUT, headers=headers
            ) as http:
                made = await http.post("/v1/session", json={"operation": "create"})
            session_id = made.json()["session_id"]
            assert made.json()["policy"] == "pip"
            proxies, networks = _egress_of(session_id)
            assert len(proxies) == 1 and len(networks) == 2  # the session's and its link
            server.process.kill()
            with anyio.fail_after(STOP_TIMEOUT):
                await server.process.wait()
        assert len(_egress_of(session_id)[0]) == 1  # nothing removed it: the server is gone

        # The registry gone with the server (a lost disk, a fresh host): the next start under
        # the same id knows no session, so it reaps every container of that id.
        for registry in data_dir.glob("registry.db*"):
            registry.unlink()
        async with running(
            worker_image.tag, tmp_path, data_dir=data_dir, orchestrator_id=first_id
        ) as second:
            assert "reaped 1 container(s)" in second.reconciled
            assert containers_of(first_id) == []
            assert _egress_of(session_id) == ([], [])
            second.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(STOP_TIMEOUT):
                await second.process.wait()
    finally:
        engine = docker.from_env(timeout=30)
        try:
            for container_id in containers_of(first_id):
                engine.api.remove_container(container_id, force=True)
        finally:
            engine.close()
