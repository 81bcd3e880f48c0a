"""``sandhold serve --backend kubernetes`` against the cluster of ``.ci/kube-cluster``: a session
is a Pod, the REPL keeps its state, the shell, processes and files work as on Docker, the Pod's
posture is the policy's (read from the API and from inside), a policy the cluster cannot enforce
is refused by name, and a stop leaves no Pod."""

from __future__ import annotations

import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.docker.test_serve import STOP_TIMEOUT, Server, running
from tests.kubernetes.cluster import Cluster

pytestmark = [pytest.mark.kubernetes, pytest.mark.anyio]

# A first call makes the Pod (scheduling, sandbox, container: seconds on a loaded machine) and
# starts the worker over an exec through the API server.
CALL_TIMEOUT = 120.0
# The scheduler says a Pod fits nowhere within a second or two; the start timeout is 120 s.
UNSCHEDULABLE_TIMEOUT = 30.0


async def ok(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


@pytest.fixture
async def server(kube_cluster: Cluster, tmp_path: Path) -> AsyncIterator[Server]:
    async with running(kube_cluster.image, tmp_path, *kube_cluster.serve_options()) as started:
        yield started
        started.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await started.process.wait()


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    key = server.notice.rsplit(": ", 1)[1]
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT, headers=headers) as c:
        yield c


async def test_a_session_is_a_pod_whose_repl_shell_processes_and_files_work(
    kube_cluster: Cluster, server: Server, http: httpx.AsyncClient
) -> None:
    with anyio.fail_after(CALL_TIMEOUT * 3):
        created = await ok(await http.post("/v1/sessions", json={"code": "x = 41"}))
        sid = created["session_id"]
        [pod] = [p for p in kube_cluster.pods() if sid in p["metadata"]["name"]]
        assert pod["metadata"]["annotations"]["sandhold.orchestrator"] == server.orchestrator_id

        run = await ok(await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x + 1"}))
        assert run["result_repr"] == "42"

        shell = await ok(
            await http.post(f"/v1/sessions/{sid}/shell", json={"command": "cd /tmp && pwd"})
        )
        assert (shell["stdout"].strip(), shell["exit_code"]) == ("/tmp", 0)
        again = await ok(await http.post(f"/v1/sessions/{sid}/shell", json={"command": "pwd"}))
        assert again["stdout"].strip() == "/tmp"  # the persistent shell kept its cwd

        started = await ok(
            await http.post(
                "/v1/process", json={"operation": "start", "session_id": sid, "command": "sleep 60"}
            )
        )
        listing = await ok(await http.get("/v1/processes", params={"session_id": sid}))
        assert [p["process_id"] for p in listing["processes"]] == [started["process_id"]]

        write = {"operation": "write", "session_id": sid, "path": "notes/a.txt", "content": "hej"}
        await ok(await http.post("/v1/files", json=write))
        read = {"operation": "read", "session_id": sid, "path": "notes/a.txt"}
        assert (await ok(await http.post("/v1/files", json=read)))["content"] == "hej"

        assert (await ok(await http.delete(f"/v1/sessions/{sid}")))["destroyed"] is True
        assert [p for p in kube_cluster.pods() if sid in p["metadata"]["name"]] == []
        gone = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
        assert gone.status_code == 404


async def test_a_session_pod_has_the_policys_posture_seen_from_the_api_and_from_inside(
    kube_cluster: Cluster, http: httpx.AsyncClient
) -> None:
    probe = (
        "import os, socket\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)\n"
        "print(os.getuid(), os.getgid(), status['CapEff'].strip(), status['CapBnd'].strip(),\n"
        "      status['NoNewPrivs'].strip(), status['Seccomp'].strip())\n"
        "try:\n"
        "    open('/etc/sandhold-probe', 'w')\n"
        "except OSError as exc:\n"
        "    print('root', exc.errno)\n"
        "import resource\n"
        "print('nofile', resource.getrlimit(resource.RLIMIT_NOFILE))\n"
        "try:\n"
        "    socket.create_connection(('10.213.0.2', 6443), timeout=2)\n"
        "    print('network open')\n"
        "except OSError:\n"
        "    print('network closed')\n"
    )
    with anyio.fail_after(CALL_TIMEOUT * 2):
        created = await ok(
            await http.post("/v1/sessions", json={"code": "1", "policy": "unrestricted-python"})
        )
        sid = created["session_id"]
        run = await ok(await http.post(f"/v1/sessions/{sid}/execute", json={"code": probe}))
    lines = run["stdout"].splitlines()
    assert lines[0] == "10001 10001 0000000000000000 0000000000000000 1 2", run
    assert lines[1] == "root 30"  # EROFS: the root file system is read-only
    assert lines[2] == "nofile (1024, 1024)"
    assert lines[3] == "network closed"
    [pod] = [p for p in kube_cluster.pods() if sid in p["metadata"]["name"]]
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"]["type"] == "Localhost"
    container = spec["containers"][0]
    assert container["resources"]["requests"] == container["resources"]["limits"]


async def test_a_policy_the_cluster_cannot_enforce_is_refused_naming_the_key(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    policy = tmp_path / "open.toml"
    policy.write_text('extends = "default"\nname = "open"\n[network]\nmode = "open"\n')
    options = [*kube_cluster.serve_options(), "--policy", str(policy)]
    async with running(kube_cluster.image, tmp_path, *options) as server:
        key = server.notice.rsplit(": ", 1)[1]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
            with anyio.fail_after(CALL_TIMEOUT):
                refused = await http.post("/v1/sessions", json={"code": "1"})
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["error_type"] == "invalid_argument"
    assert "network.mode" in body["error_message"] and "kubernetes" in body["error_message"]
    assert kube_cluster.pods() == []


async def test_a_restart_after_kill_9_re_adopts_the_sessions_with_their_state(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    orchestrator_id = f"test-kube-restart-{secrets.token_hex(4)}"
    options = kube_cluster.serve_options()
    image = kube_cluster.image
    async with running(
        image, tmp_path, *options, data_dir=data_dir, orchestrator_id=orchestrator_id
    ) as first:
        key = first.notice.rsplit(": ", 1)[1]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=first.url, headers=headers) as http:
            with anyio.fail_after(CALL_TIMEOUT):
                sid = (await ok(await http.post("/v1/sessions", json={"code": "x = 41"})))[
                    "session_id"
                ]
        first.process.kill()
        with anyio.fail_after(STOP_TIMEOUT):
            await first.process.wait()
    async with running(
        image, tmp_path, *options, data_dir=data_dir, orchestrator_id=orchestrator_id
    ) as second:
        assert "re-adopted 1 session(s)" in second.reconciled, second.reconciled
        async with httpx.AsyncClient(base_url=second.url, headers=headers) as http:
            with anyio.fail_after(CALL_TIMEOUT):
                run = await ok(
                    await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x + 1"})
                )
        assert run["result_repr"] == "42"
        second.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await second.process.wait()
    assert kube_cluster.pods() == []


async def test_a_pod_deleted_behind_sandholds_back_makes_its_session_lost(
    kube_cluster: Cluster, http: httpx.AsyncClient
) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        sid = (await ok(await http.post("/v1/sessions", json={"code": "x = 1"})))["session_id"]
    [pod] = [p["metadata"]["name"] for p in kube_cluster.pods() if sid in p["metadata"]["name"]]
    # Not forced: the Pod object goes once kubelet has stopped its container, so that is done.
    kube_cluster.api("DELETE", f"/api/v1/namespaces/{kube_cluster.namespace}/pods/{pod}")
    with anyio.fail_after(CALL_TIMEOUT):
        while any(p["metadata"]["name"] == pod for p in kube_cluster.pods()):  # noqa: ASYNC110 (no event from a blocking client; bounded)
            await anyio.sleep(0.2)
    with anyio.fail_after(CALL_TIMEOUT):
        lost = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x"})
    assert lost.json()["error_type"] == "session_lost", lost.text


async def test_a_session_no_node_has_room_for_is_refused_at_once_not_after_the_timeout(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    policy = tmp_path / "big.toml"
    policy.write_text('extends = "default"\nname = "big"\n[resources]\ncpus = 64\n')
    options = [*kube_cluster.serve_options(), "--policy", str(policy)]
    async with running(kube_cluster.image, tmp_path, *options) as server:
        key = server.notice.rsplit(": ", 1)[1]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
            with anyio.fail_after(UNSCHEDULABLE_TIMEOUT):
                refused = await http.post("/v1/sessions", json={"code": "1"}, timeout=None)
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    body = refused.json()
    assert body["error_type"] == "backend_unavailable", refused.text
    assert "no node can take" in body["error_message"]
    assert kube_cluster.pods() == []
