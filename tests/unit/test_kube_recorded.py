"""The Kubernetes backend's pure parts replayed against exchanges recorded from a real API server
(``tests/kubernetes/record_fixtures.py``, Kubernetes 1.20.2 of ``.ci/kube-cluster``; fixtures in
``tests/unit/fixtures/kubernetes/``): a Pod's create, the watch until it runs, its delete; the
refusals (403, 404, 409, 422); a watch too old (410, the one exchange written by hand); a Pod no
node takes, one whose main process was killed; the seccomp probe; the websocket frames of execs and
a refused upgrade. The fakes here stand in for the network only; every behaviour is judged on the
real cluster too (tests/kubernetes, the conformance suite)."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.kubernetes import KubernetesBackend, KubernetesSettings, pod_manifest
from orchestrator.backend.kubernetes._api import api_status, checked
from orchestrator.backend.kubernetes._exec import WebSocketExec, refused_exec
from orchestrator.backend.kubernetes._probe import probe_verdict
from orchestrator.backend.kubernetes._settings import ClusterConnection
from orchestrator.backend.kubernetes.backend import _started, _state
from orchestrator.errors import BackendError, BackendUnavailableError, ContainerNotFoundError
from orchestrator.policy.model import load_policy

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
# What the recorder gave the cluster (tests/kubernetes/cluster.py's CLUSTER_OPTIONS).
RECORDED_OPTIONS = {
    "seccomp_profile": "localhost/sandhold.json",
    "pod_pids_limit": 256,
    "network_isolated": True,
}


def recorded(name: str) -> dict[str, Any]:
    exchange: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return exchange


def answer(name: str) -> tuple[int, bytes]:
    response = recorded(name)["response"]
    return int(response["status"]), json.dumps(response["body"]).encode()


def pod_of(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = recorded(name)["response"]["body"]
    return pod


def contained(ours: Any, theirs: Any) -> bool:
    """Every field we sent is in what the API server kept, unchanged (it adds defaults)."""
    if isinstance(ours, dict):
        # A false value is left out of the answer (the API's omitempty), as absent as sent.
        return isinstance(theirs, dict) and all(
            contained(value, theirs[key]) if key in theirs else value in (False, None)
            for key, value in ours.items()
        )
    if isinstance(ours, list):
        return (
            isinstance(theirs, list)
            and len(ours) == len(theirs)
            and all(contained(a, b) for a, b in zip(ours, theirs, strict=True))
        )
    return bool(ours == theirs)


def test_a_created_pod_is_read_as_created_and_keeps_every_field_of_our_manifest() -> None:
    exchange = recorded("pod_create")
    pod = checked(*answer("pod_create"), "POST")
    assert exchange["response"]["status"] == 201
    assert _state(pod).status == "created" and not _state(pod).running
    assert not _started(pod)
    assert contained(exchange["request"]["body"]["spec"], pod["spec"])
    assert contained(
        exchange["request"]["body"]["metadata"]["annotations"], pod["metadata"]["annotations"]
    )


def test_the_recorded_create_is_the_manifest_the_backend_makes_today() -> None:
    """The fixtures are the backend's own requests: a change to ``_spec`` fails here until
    they are recorded again (python -m tests.kubernetes.record_fixtures, with a cluster up)."""
    sent = recorded("pod_create")["request"]["body"]
    annotations = sent["metadata"]["annotations"]
    policy = load_policy("default")
    policy = policy.model_copy(
        update={"resources": policy.resources.model_copy(update={"cpus": 0.1})}
    )
    spec = ContainerSpec(
        image=sent["spec"]["containers"][0]["image"],
        policy=policy,
        session_id="0123456789abcdef0123456789abcdef",
        tenant="recorded",
        orchestrator_id="sandhold-recorder",
    )
    settings = KubernetesSettings.from_options(RECORDED_OPTIONS)
    assert pod_manifest(spec, settings, annotations=annotations) == sent


def test_the_watch_events_say_running_only_at_the_last() -> None:
    events = recorded("pod_watch_until_running")["events"]
    assert {event["type"] for event in events} <= {"ADDED", "MODIFIED"}
    assert [_started(event["object"]) for event in events] == [False] * (len(events) - 1) + [True]
    state = _state(events[-1]["object"])
    assert (state.status, state.running) == ("running", True)


@pytest.mark.parametrize(
    ("name", "status", "reason"),
    [
        ("pod_create_again_409", 409, "AlreadyExists"),
        ("pod_create_invalid_422", 422, "Invalid"),
        ("pod_list_forbidden_403", 403, "Forbidden"),
    ],
)
def test_a_refusal_is_a_backend_error_caused_by_the_status_and_reason_of_the_answer(
    name: str, status: int, reason: str
) -> None:
    with pytest.raises(BackendError) as raised:
        checked(*answer(name), "a call")
    assert type(raised.value) is BackendError
    found = api_status(raised.value)
    assert found is not None and (found.status, found.reason) == (status, reason)
    assert pod_of(name)["message"] in str(raised.value)


def test_a_pod_that_is_not_there_is_not_found() -> None:
    with pytest.raises(ContainerNotFoundError, match="not found"):
        checked(*answer("pod_get_missing_404"), "GET")


def test_a_pod_no_node_can_take_is_refused_at_once_naming_the_schedulers_reason() -> None:
    with pytest.raises(BackendUnavailableError, match="no node can take") as raised:
        _started(pod_of("pod_unschedulable"))
    assert "Insufficient cpu" in str(raised.value)


def test_a_pod_whose_main_process_was_killed_has_exited() -> None:
    state = _state(pod_of("pod_main_process_killed"))
    assert (state.status, state.running, state.exit_code) == ("exited", False, 137)
    with pytest.raises(Exception, match="ended while starting"):
        _started(pod_of("pod_main_process_killed"))


def test_a_deleted_pod_is_removing() -> None:
    pod = checked(*answer("pod_delete"), "DELETE")
    assert _state(pod).status == "removing" and not _state(pod).running


def test_the_seccomp_probe_says_ok_or_names_the_profile_the_node_lacks() -> None:
    assert probe_verdict(pod_of("probe_seccomp_succeeded"), "localhost/sandhold.json") == "ok"
    verdict = probe_verdict(pod_of("probe_seccomp_missing"), "localhost/no-such.json")
    assert verdict is not None and "cannot be honoured" in verdict and "no-such.json" in verdict


class RecordedWebSocket:
    """The frames an exec's websocket received, then its close: the network, replayed."""

    def __init__(self, name: str) -> None:
        response = recorded(name)["response"]
        self.subprotocol = response["subprotocol"]
        self.frames = [base64.b64decode(frame) for frame in response["frames_base64"]]

    async def recv(self) -> bytes:
        if not self.frames:
            raise ConnectionClosed(None, None)
        return self.frames.pop(0)

    async def close(self) -> None:
        self.frames = []


async def replay(name: str) -> tuple[list[tuple[int, bytes]], int | None, WebSocketExec]:
    stream = WebSocketExec("recorded", RecordedWebSocket(name), framed=False)  # type: ignore[arg-type]
    chunks = []
    while (chunk := await stream.receive()) is not None:
        chunks.append(chunk)
    return chunks, stream.exit_code, stream


@pytest.mark.anyio
async def test_an_execs_frames_give_its_output_by_channel_and_its_exit_code() -> None:
    chunks, exit_code, stream = await replay("exec_output_and_exit_code")
    assert stream.protocol == "v4.channel.k8s.io"  # 1.20 offers nothing newer
    assert b"".join(data for channel, data in chunks if channel == 1) == b"out\n"
    assert b"".join(data for channel, data in chunks if channel == 2) == b"err\n"
    assert exit_code == 3 and stream.ended.is_set()
    assert (await replay("exec_success"))[1] == 0


@pytest.mark.anyio
async def test_an_exec_of_a_missing_command_ends_as_the_shell_would_say() -> None:
    _, exit_code, _ = await replay("exec_missing_command")
    assert exit_code == 127


@pytest.mark.parametrize("name", ["exec_missing_pod_404", "exec_in_ended_pod"])
def test_an_exec_refused_for_a_pod_gone_or_ended_is_not_found(name: str) -> None:
    response = recorded(name)["response"]
    error = refused_exec(response["status"], response["body"].encode())
    assert isinstance(error, ContainerNotFoundError), error


class ReplayedApi:
    """The API calls of ``_wait_running``, answered from recordings."""

    def __init__(self, watches: list[list[dict[str, Any]]], gets: list[dict[str, Any]]) -> None:
        self.watches = watches
        self.gets = gets
        self.calls: list[str] = []

    def pods_path(self, name: str | None = None) -> str:
        return "/pods" if name is None else f"/pods/{name}"

    async def watch(
        self, path: str, params: Mapping[str, str]
    ) -> AsyncGenerator[dict[str, Any], None]:
        self.calls.append(f"watch from {params.get('resourceVersion', '(now)')}")
        for event in self.watches.pop(0):
            yield event

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append(f"{method} {path}")
        return self.gets.pop(0)


@pytest.mark.anyio
async def test_a_watch_too_old_starts_again_from_the_pod_as_it_is_now() -> None:
    # Not recorded: 1.20's watch cache keeps about 75 s of events, so a version goes too old
    # only after a wait longer than the recorder's. The event as the API documents it.
    expired = [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": "too old resource version: 1 (2)",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    created = pod_of("pod_create")
    events = recorded("pod_watch_until_running")["events"]
    backend = KubernetesBackend(
        KubernetesSettings(),
        connection=ClusterConnection("https://recorded", ssl.create_default_context(), {}, "ns"),
    )
    api = ReplayedApi([expired, events], [events[0]["object"]])
    backend.api = api  # type: ignore[assignment]
    await backend._wait_running(created["metadata"]["name"], created)
    name = created["metadata"]["name"]
    version = created["metadata"]["resourceVersion"]
    first = events[0]["object"]["metadata"]["resourceVersion"]
    assert api.calls == [f"watch from {version}", f"GET /pods/{name}", f"watch from {first}"]
