"""Record real exchanges with the cluster of ``.ci/kube-cluster`` as the unit fixtures under
``tests/unit/fixtures/kubernetes/`` (``tests/unit/test_kube_recorded.py`` replays them against the
backend's pure parts: parsing, error mapping, the spec). Run it again when the backend's requests
change; the real cluster remains the judge of every behaviour (tests/kubernetes).

    .venv/bin/python -m tests.kubernetes.record_fixtures

Each fixture is the request as sent and the answer as received, with ``managedFields`` (the server's
bookkeeping, kilobytes a Pod) left out. The exchanges: a session Pod's create, the watch events
until it runs, its delete; a second create of the same name (409), a Pod the API refuses (422), a
user with no rights (403), a Pod that does not exist (404), a Pod no node can take (Unschedulable),
the main process of a Pod killed (its container terminated), a Localhost seccomp profile missing
from the node (CreateContainerError) and the seccomp probe that succeeds, and the websocket frames
of execs (output, stderr, an exit code, a missing command, the upgrade refused for a gone Pod).
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import tests.conftest  # noqa: F401  (first: it imports tests.kubernetes.cluster itself)
from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.kubernetes import KubernetesSettings, pod_manifest
from orchestrator.backend.kubernetes._probe import probe_manifest
from orchestrator.policy.model import load_policy
from tests.kubernetes.cluster import CLUSTER_OPTIONS, RUN, _server, containerd_socket

OUT = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "kubernetes"
NAMESPACE = f"sandhold-record-{secrets.token_hex(3)}"
# Each wait below is for a Pod to reach a state: seconds on this machine.
WAIT_S = 120.0


def context(user: str = "admin") -> ssl.SSLContext:
    tls = ssl.create_default_context(cafile=str(RUN / "pki" / "ca.crt"))
    tls.load_cert_chain(str(RUN / "pki" / f"{user}.crt"), str(RUN / "pki" / f"{user}.key"))
    return tls


def call(method: str, path: str, body: Any = None, *, user: str = "admin") -> dict[str, Any]:
    """One exchange, recorded whatever its status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{_server()}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, context=context(user), timeout=30) as answer:
            status, content = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        status, content = exc.code, exc.read()
    return {
        "request": {"method": method, "path": path, **({"body": body} if body else {})},
        "response": {"status": status, "body": _trim(json.loads(content))},
    }


def _trim(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items() if k != "managedFields"}
    if isinstance(value, list):
        return [_trim(v) for v in value]
    return value


def save(name: str, exchange: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(exchange, indent=1, sort_keys=True) + "\n")
    print(f"recorded {name}", file=sys.stderr)


def pods(name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{NAMESPACE}/pods"
    return base if name is None else f"{base}/{name}"


def wait_pod(name: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        pod = call("GET", pods(name))["response"]["body"]
        if done(pod):
            return pod
        time.sleep(0.2)  # a blocking recorder polls; bounded by the deadline
    raise TimeoutError(f"Pod {name} did not reach the state awaited")


def watch(params: dict[str, str], until: Any) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({**params, "watch": "1", "timeoutSeconds": "60"})
    request = urllib.request.Request(f"{_server()}{pods()}?{query}")
    events = []
    with urllib.request.urlopen(request, context=context(), timeout=WAIT_S) as answer:
        for line in answer:
            if line.strip():
                events.append(_trim(json.loads(line)))
                if until(events[-1]):
                    break
    return events


def exec_frames(pod: str, argv: list[str], *, container: str = "sandbox") -> dict[str, Any]:
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    query = [("container", container), ("stdout", "true"), ("stderr", "true")]
    query += [("command", arg) for arg in argv]
    path = f"{pods(pod)}/exec?{urllib.parse.urlencode(query)}"
    url = _server().replace("https://", "wss://", 1) + path
    frames = []
    try:
        with connect(
            url,
            ssl=context(),
            subprotocols=["v5.channel.k8s.io", "v4.channel.k8s.io"],  # type: ignore[list-item]
            compression=None,
            proxy=None,
            open_timeout=WAIT_S,
        ) as ws:
            protocol = ws.subprotocol
            try:
                while True:
                    message = ws.recv(timeout=WAIT_S)
                    assert isinstance(message, bytes)
                    frames.append(base64.b64encode(message).decode())
            except ConnectionClosed:
                pass
    except InvalidStatus as exc:
        body = exc.response.body or b""
        return {
            "request": {"path": path, "subprotocols": ["v5.channel.k8s.io", "v4.channel.k8s.io"]},
            "response": {"status": exc.response.status_code, "body": body.decode()},
        }
    return {
        "request": {"path": path, "subprotocols": ["v5.channel.k8s.io", "v4.channel.k8s.io"]},
        "response": {"status": 101, "subprotocol": protocol, "frames_base64": frames},
    }


def running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses and "running" in (statuses[0].get("state") or {}))


def nobody_user() -> None:
    """A client certificate the cluster's CA signed for a user bound to no Role."""
    pki = RUN / "pki"
    if (pki / "nobody.crt").exists():
        return
    with tempfile.TemporaryDirectory() as scratch:
        csr = Path(scratch) / "nobody.csr"
        subprocess.run(
            ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout",
             str(pki / "nobody.key"), "-subj", "/O=sandhold-nobody/CN=sandhold-nobody",
             "-out", str(csr)],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey",
             str(pki / "ca.key"), "-CAcreateserial", "-days", "1", "-out", str(pki / "nobody.crt")],
            check=True, capture_output=True,
        )  # fmt: skip


def main() -> None:
    image = (RUN / "worker-image").read_text().strip()
    settings = KubernetesSettings.from_options({**CLUSTER_OPTIONS, "namespace": NAMESPACE})
    call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    try:
        wait_for_account()
        record(image, settings)
    finally:
        call("DELETE", f"/api/v1/namespaces/{NAMESPACE}?gracePeriodSeconds=0")


def wait_for_account() -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"
    deadline = time.monotonic() + WAIT_S
    while call("GET", path)["response"]["status"] != 200:
        if time.monotonic() > deadline:
            raise TimeoutError("no default service account")
        time.sleep(0.2)


def spec_of(image: str, session_id: str, **resources: Any) -> ContainerSpec:
    policy = load_policy("default")
    if resources:
        policy = policy.model_copy(
            update={"resources": policy.resources.model_copy(update=resources)}
        )
    return ContainerSpec(
        image=image,
        policy=policy,
        session_id=session_id,
        tenant="recorded",
        orchestrator_id="sandhold-recorder",
    )


def record(image: str, settings: KubernetesSettings) -> None:
    spec = spec_of(image, "0123456789abcdef0123456789abcdef", cpus=0.1)
    manifest = pod_manifest(spec, settings, annotations=dict(spec.labels))
    name = manifest["metadata"]["name"]
    created = call("POST", pods(), manifest)
    save("pod_create", created)
    version = created["response"]["body"]["metadata"]["resourceVersion"]
    events = watch(
        {"fieldSelector": f"metadata.name={name}", "resourceVersion": version},
        lambda event: running(event.get("object") or {}),
    )
    save("pod_watch_until_running", {"request": {"path": pods()}, "events": events})
    save("pod_create_again_409", call("POST", pods(), manifest))
    save("pod_get_missing_404", call("GET", pods("sandhold-no-such-pod")))
    invalid = json.loads(json.dumps(manifest))
    invalid["metadata"]["name"] = "Not_A_Valid_Name"
    save("pod_create_invalid_422", call("POST", pods(), invalid))
    nobody_user()
    save("pod_list_forbidden_403", call("GET", pods(), user="nobody"))
    save(
        "exec_output_and_exit_code",
        exec_frames(name, ["sh", "-c", "echo out; echo err >&2; exit 3"]),
    )
    save("exec_success", exec_frames(name, ["true"]))
    save("exec_missing_command", exec_frames(name, ["no-such-command"]))
    save("exec_missing_pod_404", exec_frames("sandhold-no-such-pod", ["true"]))

    big = spec_of(image, "fedcba9876543210fedcba9876543210", cpus=64.0)
    big_manifest = pod_manifest(big, settings, annotations=dict(big.labels))
    call("POST", pods(), big_manifest)
    big_name = big_manifest["metadata"]["name"]
    unschedulable = wait_pod(
        big_name,
        lambda pod: any(
            c.get("reason") == "Unschedulable"
            for c in (pod.get("status") or {}).get("conditions") or []
        ),
    )
    save(
        "pod_unschedulable",
        {"request": {"path": pods(big_name)}, "response": {"status": 200, "body": unschedulable}},
    )
    call("DELETE", pods(big_name) + "?gracePeriodSeconds=0")

    container = created["response"]["body"]["metadata"]["name"]
    pod = call("GET", pods(container))["response"]["body"]
    ctr_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    socket = containerd_socket(pod["spec"]["nodeName"])
    subprocess.run(
        ["ctr", "--address", str(socket), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", ctr_id],
        check=True,
    )
    killed = wait_pod(
        container,
        lambda p: (
            "terminated" in ((p["status"].get("containerStatuses") or [{}])[0].get("state") or {})
        ),
    )
    save(
        "pod_main_process_killed",
        {"request": {"path": pods(container)}, "response": {"status": 200, "body": killed}},
    )
    save("exec_in_ended_pod", exec_frames(container, ["true"]))
    save("pod_delete", call("DELETE", pods(container) + "?gracePeriodSeconds=0"))

    missing = KubernetesSettings.from_options(
        {**CLUSTER_OPTIONS, "namespace": NAMESPACE, "seccomp_profile": "localhost/no-such.json"}
    )
    probe = probe_manifest(missing, image)
    call("POST", pods(), probe)
    failed = wait_pod(
        probe["metadata"]["name"],
        lambda p: any(
            ((s.get("state") or {}).get("waiting") or {}).get("reason", "").startswith("Create")
            for s in (p.get("status") or {}).get("containerStatuses") or []
        ),
    )
    save(
        "probe_seccomp_missing",
        {
            "request": {"path": pods(probe["metadata"]["name"]), "body": probe},
            "response": {"status": 200, "body": failed},
        },
    )
    call("DELETE", pods(probe["metadata"]["name"]) + "?gracePeriodSeconds=0")
    probe = probe_manifest(settings, image)
    call("POST", pods(), probe)
    succeeded = wait_pod(
        probe["metadata"]["name"], lambda p: p["status"].get("phase") == "Succeeded"
    )
    save(
        "probe_seccomp_succeeded",
        {
            "request": {"path": pods(probe["metadata"]["name"]), "body": probe},
            "response": {"status": 200, "body": succeeded},
        },
    )
    call("DELETE", pods(probe["metadata"]["name"]) + "?gracePeriodSeconds=0")


if __name__ == "__main__":
    main()
