"""The Kubernetes backend: one bare Pod per session, execs through the API server.

A container id is the Pod's name, in the backend's namespace. The Pod is made from the policy by
``_spec.pod_manifest`` after ``_spec.refusals`` found nothing the Pod cannot enforce; it is
created, then watched until its container runs, and deleted on every path that fails after it
was created, so a failed create never leaks one. Kubernetes places it; sandhold never
schedules. A session's labels live whole in the Pod's annotations, and every listing starts
from the one label all our Pods carry (``LABEL_MANAGED``).

Execs go through ``_relay`` (environment, working directory, per-process limits, a process group
of their own, and on ``v4`` a stdin that can end) over the websocket channel protocol
(``_exec``). An exec's exit code comes with its stream's end; a stream that ends without one was
cut (the Pod went, or the connection): ``exec_exit_code`` tells the two apart by asking for the
Pod. A Pod whose node stopped reporting is ``unreachable`` (not running) once the node controller
has marked it not ready; until then an exec the API server cannot take to its kubelet is
``BackendUnavailableError``, and after, ``ContainerNotFoundError`` (the session is lost).

``readiness_checks`` gives ``/readyz`` a line naming the seccomp profile Pods get, ``ok`` only
once a node honoured it (``_probe``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from orchestrator.backend.base import (
    ContainerSpec,
    ContainerState,
    ContainerSummary,
    ExecResult,
    ExecSpec,
    SnapshotImage,
    check_exec_spec,
)
from orchestrator.backend.kubernetes._api import ApiClient, api_status
from orchestrator.backend.kubernetes._exec import (
    PROTOCOL_V5,
    WebSocketExec,
    open_websocket,
)
from orchestrator.backend.kubernetes._probe import OK, probe_manifest, probe_name, probe_verdict
from orchestrator.backend.kubernetes._relay import relay_argv
from orchestrator.backend.kubernetes._settings import (
    SECCOMP_RUNTIME_DEFAULT,
    ClusterConnection,
    KubernetesSettings,
    connect,
)
from orchestrator.backend.kubernetes._spec import (
    CONTAINER,
    FIXED_ENV,
    LABEL_MANAGED,
    pod_manifest,
    refusals,
)
from orchestrator.backend.network_log import EgressCounters
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    ContainerNotFoundError,
    InvalidArgumentError,
    NotSupportedError,
    OrchestratorError,
)

__all__ = ["KubernetesBackend"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_NO_IMAGES = "the kubernetes backend cannot make an image of a session (snapshots need Docker)"
# The annotation holding a session's per-process limits, for the execs of any orchestrator
# that re-adopts it.
ANNOTATION_LIMITS = "sandhold.limits"
# From create to a running container: scheduling, the sandbox, the container; 1.6 s on an idle
# machine here, many times that on a loaded node, never minutes.
POD_START_TIMEOUT = 120.0
# Container states a Pod does not leave by itself: the create has failed.
FAILED_WAITING = frozenset(
    {
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
# Exit codes kept for execs whose streams have ended (a caller asks once, just after the end).
MAX_ENDED_EXECS = 4096
# Reading a Pod's counters is one short exec of a few file reads.
STATS_TIMEOUT = 15.0
# A stats read prints a few numbers.
STATS_MAX_BYTES = 4096
# The counters of the container's own cgroup, v1 or v2, as one JSON line.
_STATS = r"""
import json
def read(*paths):
    for path in paths:
        try:
            with open("/sys/fs/cgroup/" + path) as f:
                return f.read().strip()
        except OSError:
            pass
    return "0"
def number(text):
    try:
        return float(text)
    except ValueError:
        return 0.0
def field(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return number(line.split()[1])
    return 0.0
cpu = number(read("cpuacct/cpuacct.usage", "cpu,cpuacct/cpuacct.usage")) / 1e9
cpu = cpu or field(read("cpu.stat"), "usage_usec") / 1e6
print(json.dumps({
    "memory_bytes": number(read("memory/memory.usage_in_bytes", "memory.current")),
    "memory_limit_bytes": number(read("memory/memory.limit_in_bytes", "memory.max")),
    "pids": number(read("pids/pids.current", "pids.current")),
    "cpu_seconds": cpu,
    "oom_kills": field(read("memory/memory.oom_control", "memory.events"), "oom_kill"),
}))
"""


class KubernetesBackend:
    """``Backend`` on a Kubernetes cluster, in one namespace."""

    def __init__(
        self,
        settings: KubernetesSettings | None = None,
        *,
        connection: ClusterConnection | None = None,
    ) -> None:
        self.settings = settings or KubernetesSettings()
        self.api = ApiClient(connection or connect(self.settings))
        self.namespace = self.api.namespace
        # The channel protocol the API server chose, learnt at the first exec: until then (and
        # on v4) stdin goes through the relay's frames, which work on either.
        self.protocol: str | None = None
        self._execs: OrderedDict[str, WebSocketExec] = OrderedDict()
        self._attached: weakref.WeakKeyDictionary[WebSocketExec, str] = weakref.WeakKeyDictionary()
        self._limits: dict[str, tuple[int, int]] = {}
        self._oom_seen: dict[str, int] = {}
        # Whether the nodes honour the seccomp profile: None until a probe Pod or a session Pod
        # has said (``_probe``); ``ok`` or what went wrong.
        self._seccomp_verdict: str | None = None

    # -- the engine ------------------------------------------------------------------------

    async def ping(self) -> None:
        await self.api.request("GET", self.api.pods_path(), params={"limit": "1"})

    async def aclose(self) -> None:
        for stream in list(self._attached):
            await stream.aclose()
        await self.api.aclose()

    def readiness_checks(self, image: str | None) -> dict[str, Callable[[], Awaitable[str]]]:
        """The checks ``/readyz`` adds for this backend: its key names the seccomp profile
        session Pods get; ready only once the nodes are seen to honour it."""

        async def seccomp() -> str:
            return await self._seccomp_check(image)

        return {f"seccomp {self.settings.seccomp_profile}": seccomp}

    async def _seccomp_check(self, image: str | None) -> str:
        if self.settings.seccomp_profile == SECCOMP_RUNTIME_DEFAULT:
            return OK  # the runtime's own profile: nothing to place on the nodes
        if self._seccomp_verdict is not None:
            return self._seccomp_verdict
        if image is None:
            return "not checked: no worker image chosen yet (a probe Pod runs it)"
        manifest = probe_manifest(self.settings, image)
        name = probe_name(self.settings)
        try:
            pod = await self.api.request("POST", self.api.pods_path(), body=manifest)
        except BackendError as exc:
            answer = api_status(exc)
            if answer is None or answer.status != 409:  # 409: a probe of ours is there: read it
                raise
            pod = await self.api.request("GET", self.api.pods_path(name))
        verdict = probe_verdict(pod, self.settings.seccomp_profile)
        if verdict is None:
            return f"checking: probe Pod {name} has not started yet"
        self._seccomp_verdict = verdict
        with contextlib.suppress(ContainerNotFoundError):
            await self.api.request(
                "DELETE", self.api.pods_path(name), params={"gracePeriodSeconds": "0"}
            )
        return verdict

    def describe(self) -> dict[str, str]:
        """What the Pods get that the operator chose (``readyz`` shows it)."""
        return {
            "namespace": self.namespace,
            "seccomp": self.settings.seccomp_profile,
            "runtime_class": self.settings.runtime_class or "(the cluster's default)",
        }

    # -- Pods ------------------------------------------------------------------------------

    async def create_container(self, spec: ContainerSpec) -> str:
        refused = refusals(spec, self.settings)
        if refused:
            key, reason = refused[0]
            raise InvalidArgumentError(
                f"policy {spec.policy.name!r}: {key} cannot be enforced by the kubernetes "
                f"backend: {reason}",
                hint="use a policy this backend can enforce (docs/kubernetes.md)",
            )
        res = spec.policy.resources
        limits = (res.nofile, res.fsize_mb * MIB)
        annotations = {**spec.labels, ANNOTATION_LIMITS: f"{limits[0]},{limits[1]}"}
        manifest = pod_manifest(spec, self.settings, annotations=annotations)
        name = manifest["metadata"]["name"]
        created = await self.api.request("POST", self.api.pods_path(), body=manifest)
        self._limits[name] = limits
        try:
            await self._wait_running(name, created)
        except BaseException as exc:
            if isinstance(exc, OrchestratorError) and "seccomp" in str(exc):
                self._seccomp_verdict = None  # the next readiness check probes again
            with anyio.CancelScope(shield=True):
                await self.remove_container(name)
            raise
        self._seccomp_verdict = OK  # a Pod runs with the profile
        return str(name)

    async def _wait_running(self, name: str, pod: dict[str, Any]) -> None:
        version = str((pod.get("metadata") or {}).get("resourceVersion", ""))
        try:
            with anyio.fail_after(POD_START_TIMEOUT):
                while not _started(pod):
                    params = {"fieldSelector": f"metadata.name={name}"}
                    if version:
                        params["resourceVersion"] = version
                    events = self.api.watch(self.api.pods_path(), params)
                    async with contextlib.aclosing(events):  # its connection goes back at once
                        async for event in events:
                            if event.get("type") == "ERROR":
                                version = ""  # too old: start again from the Pod as it is now
                                break
                            pod = event.get("object") or {}
                            version = str((pod.get("metadata") or {}).get("resourceVersion", ""))
                            if event.get("type") == "DELETED":
                                raise BackendError(f"Pod {name} was deleted while starting")
                            if _started(pod):
                                return
                    if not version:  # and the watch goes on from the Pod as it is now
                        pod = await self.api.request("GET", self.api.pods_path(name))
                        version = str((pod.get("metadata") or {}).get("resourceVersion", ""))
        except TimeoutError:
            raise BackendUnavailableError(
                f"Pod {name} did not start within {POD_START_TIMEOUT:.0f} s",
                hint="kubectl describe pod: the node, the image and the events say why",
            ) from None

    async def remove_container(self, container_id: str) -> None:
        with contextlib.suppress(ContainerNotFoundError):  # gone already
            await self.api.request(
                "DELETE", self.api.pods_path(container_id), params={"gracePeriodSeconds": "0"}
            )
        self._limits.pop(container_id, None)
        self._oom_seen.pop(container_id, None)
        for stream, pod in list(self._attached.items()):
            if pod == container_id:
                await stream.aclose()

    async def container_state(self, container_id: str) -> ContainerState:
        pod = await self.api.request("GET", self.api.pods_path(container_id))
        return _state(pod)

    async def list_containers(self, labels: Mapping[str, str]) -> list[str]:
        wanted = [f"{key}={value}" for key, value in labels.items()]
        return [summary.id for summary in await self.describe_containers(wanted)]

    async def describe_containers(self, labels: Sequence[str]) -> list[ContainerSummary]:
        listed = await self.api.request(
            "GET", self.api.pods_path(), params={"labelSelector": LABEL_MANAGED}
        )
        found = []
        for pod in listed.get("items") or []:
            meta = pod.get("metadata") or {}
            annotations = {
                key: value
                for key, value in (meta.get("annotations") or {}).items()
                # Kubernetes' own (``*.kubernetes.io/...``) are not the session's labels.
                if key != ANNOTATION_LIMITS and "kubernetes.io/" not in key
            }
            if all(_matches(annotations, wanted) for wanted in labels):
                found.append(
                    ContainerSummary(
                        id=str(meta.get("name")),
                        labels=annotations,
                        state=_state(pod).status,
                        created=_timestamp(meta.get("creationTimestamp")),
                    )
                )
        return found

    async def pause(self, container_id: str) -> None:
        await self._refuse_pause(container_id)

    async def unpause(self, container_id: str) -> None:
        await self._refuse_pause(container_id)

    async def _refuse_pause(self, container_id: str) -> None:
        """A Pod cannot be frozen: refused, for a Pod that runs; a gone one is not found."""
        if not (await self.container_state(container_id)).running:
            raise ContainerNotFoundError(f"Pod {container_id} no longer runs")
        raise InvalidArgumentError("the kubernetes backend cannot pause a session (a Pod)")

    async def stats(self, container_id: str) -> dict[str, float]:
        read = await self._counters(container_id)
        read.pop("oom_kills", None)
        return read

    async def oom_kills(self, container_id: str, *, since: float, until: float) -> int:
        """OOM kills in the container's cgroup since this backend last asked (Kubernetes keeps
        no time of a kill inside a running container; the caller asks right after a loss)."""
        count = int((await self._counters(container_id)).get("oom_kills", 0))
        before = self._oom_seen.get(container_id, 0)
        self._oom_seen[container_id] = count
        return max(0, count - before)

    async def _counters(self, container_id: str) -> dict[str, float]:
        result = await self.run(
            container_id,
            ExecSpec(argv=["python3", "-I", "-c", _STATS], workdir="/"),
            timeout=STATS_TIMEOUT,
            max_output_bytes=STATS_MAX_BYTES,
        )
        try:
            read = json.loads(result.stdout)
        except ValueError:
            raise BackendError(f"Pod {container_id}: unreadable counters") from None
        return {str(k): float(v) for k, v in read.items()}

    # -- egress: none on this backend (refused at creation) ---------------------------------

    async def network_log(self, container_id: str) -> list[dict[str, Any]]:
        return []

    async def set_egress_allow(self, container_id: str, allow: list[str]) -> None:
        raise BackendError("the session has no egress proxy (the kubernetes backend runs none)")

    async def egress_counters(self, container_id: str) -> EgressCounters | None:
        return None

    async def final_egress_counters(self, container_id: str) -> EgressCounters | None:
        return None

    async def set_egress_refusal(self, container_id: str, rule: str | None) -> None:
        raise BackendError("the session has no egress proxy (the kubernetes backend runs none)")

    async def reap_egress(self, orchestrator_id: str, keep: set[str]) -> list[str]:
        return []

    # -- snapshot images: none (a Pod cannot be made an image) ------------------------------

    async def commit_container(
        self,
        container_id: str,
        *,
        reference: str,
        labels: Mapping[str, str],
        files: Path | None = None,
    ) -> SnapshotImage:
        raise NotSupportedError(_NO_IMAGES)

    async def remove_image(self, reference: str) -> bool:
        raise NotSupportedError(_NO_IMAGES)

    async def list_images(self, labels: Sequence[str]) -> list[SnapshotImage]:
        raise NotSupportedError(_NO_IMAGES)

    # -- execs -----------------------------------------------------------------------------

    async def open_exec(self, container_id: str, spec: ExecSpec) -> WebSocketExec:
        return await self._open(container_id, spec, stdin=True)

    async def _open(self, container_id: str, spec: ExecSpec, *, stdin: bool) -> WebSocketExec:
        check_exec_spec(spec)
        nofile, fsize = await self._limits_of(container_id)
        framed = stdin and not spec.tty and self.protocol != PROTOCOL_V5
        argv = relay_argv(
            spec.argv,
            env={**FIXED_ENV, **spec.env},
            workdir=spec.workdir,
            nofile=nofile,
            fsize_bytes=fsize,
            pipe=framed,
        )
        query = [
            ("container", CONTAINER),
            ("stdin", "true" if stdin else "false"),
            ("stdout", "true"),
            ("stderr", "false" if spec.tty else "true"),
            ("tty", "true" if spec.tty else "false"),
        ] + [("command", arg) for arg in argv]
        url = self.api.websocket_url(f"{self.api.pods_path(container_id)}/exec", query)
        try:
            ws = await open_websocket(
                url,
                ssl_context=self.api.connection.ssl_context,
                headers=dict(self.api.connection.headers),
            )
        except BackendUnavailableError:
            # Its node does not answer: lost once the node controller has said so (``_state``),
            # unavailable until then.
            if not (await self.container_state(container_id)).running:
                raise ContainerNotFoundError(f"Pod {container_id} no longer runs") from None
            raise
        self.protocol = ws.subprotocol
        stream = WebSocketExec(f"k8s-exec-{secrets.token_hex(12)}", ws, framed=framed)
        if not stdin:
            await stream.send_eof()
        self._remember(stream, container_id)
        return stream

    def _remember(self, stream: WebSocketExec, container_id: str) -> None:
        self._attached[stream] = container_id
        self._execs[stream.exec_id] = stream
        while len(self._execs) > MAX_ENDED_EXECS:
            oldest = next(iter(self._execs))
            if not self._execs[oldest].ended.is_set():
                break
            del self._execs[oldest]

    async def _limits_of(self, container_id: str) -> tuple[int, int]:
        if container_id not in self._limits:
            pod = await self.api.request("GET", self.api.pods_path(container_id))
            text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_LIMITS)
            try:
                nofile, fsize = (int(part) for part in str(text).split(","))
            except ValueError:
                raise BackendError(f"Pod {container_id} carries no limits of ours") from None
            self._limits[container_id] = (nofile, fsize)
        return self._limits[container_id]

    def _stream(self, exec_id: str) -> WebSocketExec:
        try:
            return self._execs[exec_id]
        except KeyError:
            raise ContainerNotFoundError(f"no such exec: {exec_id}") from None

    async def exec_exit_code(self, exec_id: str) -> int | None:
        stream = self._stream(exec_id)
        if not stream.ended.is_set() or stream.exit_code is not None:
            return stream.exit_code
        # Ended without a status: the Pod went, or only our connection did.
        pod = self._attached.get(stream)
        if pod is not None and not (await self.container_state(pod)).running:
            raise ContainerNotFoundError(f"Pod {pod} no longer runs")
        return None

    async def wait_exec_exit(self, exec_id: str, *, timeout: float) -> int | None:
        stream = self._stream(exec_id)
        with anyio.move_on_after(timeout):
            await stream.ended.wait()
        return stream.exit_code

    async def exec_resize(self, exec_id: str, *, rows: int, cols: int) -> None:
        await self._stream(exec_id).resize(rows=rows, cols=cols)

    async def run(
        self, container_id: str, spec: ExecSpec, *, timeout: float, max_output_bytes: int
    ) -> ExecResult:
        """Run to completion with no stdin; output beyond the cap per stream is counted as
        truncation, not kept; the exit code None on a timeout."""
        stream = await self._open(container_id, spec, stdin=False)
        out, err = bytearray(), bytearray()
        truncated = timed_out = False
        try:
            with anyio.move_on_after(timeout) as scope:
                while (chunk := await stream.receive()) is not None:
                    target = err if chunk[0] == 2 else out
                    room = max_output_bytes - len(target)
                    truncated |= len(chunk[1]) > room
                    target += chunk[1][: max(room, 0)]
            timed_out = scope.cancelled_caught
        finally:
            await stream.aclose()
        exit_code = None if timed_out else stream.exit_code
        if exit_code is None and not timed_out:
            await self.exec_exit_code(stream.exec_id)  # a Pod that went says so
        return ExecResult(exit_code, bytes(out), bytes(err), truncated, timed_out)


def _matches(labels: Mapping[str, str], wanted: str) -> bool:
    key, sep, value = wanted.partition("=")
    return key in labels and (not sep or labels[key] == value)


def _timestamp(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _container_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return dict(status)
    return {}


def _started(pod: Mapping[str, Any]) -> bool:
    """True once the container runs; a failure to get there raised."""
    if not pod:
        return False
    name = (pod.get("metadata") or {}).get("name")
    phase = (pod.get("status") or {}).get("phase")
    state = _container_status(pod).get("state") or {}
    if "running" in state:
        return True
    waiting = state.get("waiting") or {}
    if (reason := waiting.get("reason")) in FAILED_WAITING:
        message = waiting.get("message") or reason
        hint = (
            "the nodes must hold the image (imagePullPolicy Never; docs/kubernetes.md)"
            if "Image" in reason
            else f"kubectl describe pod {name}: its events say why"
        )
        raise BackendUnavailableError(f"Pod {name} cannot start: {message}", hint=hint)
    if "terminated" in state or phase in ("Succeeded", "Failed"):
        raise BackendError(f"Pod {name} ended while starting ({phase})")
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            # No node has room (requests = limits: a node holds its CPUs' worth of sessions):
            # said now rather than after the start timeout.
            raise BackendUnavailableError(
                f"no node can take Pod {name}: {condition.get('message')}",
                hint="fewer sessions, a policy with less cpus or memory, or more nodes",
            )
    return False


def _node_lost(pod: Mapping[str, Any]) -> bool:
    """The node controller marked the Pod not ready while its container, last its kubelet
    said, runs and is ready: the node stopped reporting (its kubelet gone, the node down or cut
    off) for longer than the controller's grace. Nothing else makes a Pod of ours not ready
    (it has no readiness probe, and no restart)."""
    container = _container_status(pod)
    if not container.get("ready") or "running" not in (container.get("state") or {}):
        return False
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "False"
        for condition in (pod.get("status") or {}).get("conditions") or []
    )


def _state(pod: Mapping[str, Any]) -> ContainerState:
    meta = pod.get("metadata") or {}
    phase = str((pod.get("status") or {}).get("phase", "Unknown"))
    state = _container_status(pod).get("state") or {}
    terminated = state.get("terminated")
    lost = _node_lost(pod)
    running = "running" in state and not meta.get("deletionTimestamp") and not lost
    if meta.get("deletionTimestamp"):
        status = "removing"
    elif lost:
        status = "unreachable"
    elif running:
        status = "running"
    elif terminated or phase in ("Succeeded", "Failed"):
        status = "exited"
    else:
        status = "created"
    return ContainerState(
        status=status,
        running=running,
        oom_killed=bool(terminated and terminated.get("reason") == "OOMKilled"),
        exit_code=terminated.get("exitCode") if terminated else None,
        pid=None,
    )
