"""What a container backend offers the layers above it. Everything here is engine-neutral: every
caller above ``backend/`` types against ``Backend`` and ``ExecStream``; the Docker implementation
lives in ``backend/docker``, an in-memory one for pure-logic unit tests in ``backend/fake``, and
``tests/docker/test_backend_conformance.py`` states the contract both keep.

The contract, besides the signatures: a container of ours carries the spec's labels and is found
by them; a container the engine no longer has, or that no longer runs, is
``ContainerNotFoundError`` wherever it is named (state, pause, exec); ``remove_container`` is
idempotent; an exec's stream ends (``receive`` gives None) when its process ends or when the
backend removes its container (under runsc a removal from outside can leave it open: callers
that wait on a stream also watch ``container_state``); errors are the orchestrator's own
(``BackendError`` and below), never the engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from orchestrator.errors import InvalidArgumentError

if TYPE_CHECKING:  # a type only: `sandhold ps` and `kill` never build the policy model
    from orchestrator.backend.network_log import EgressCounters
    from orchestrator.policy.model import Policy

__all__ = [
    "HOME",
    "LABEL_ORCHESTRATOR",
    "LABEL_POLICY_NAME",
    "LABEL_SESSION",
    "LABEL_SNAPSHOT",
    "LABEL_SNAPSHOT_ORCHESTRATOR",
    "LABEL_TENANT",
    "LEGACY_LABEL_ORCHESTRATOR",
    "SANDBOX_UID",
    "SNAPSHOT_FILES",
    "STDERR",
    "STDOUT",
    "WORKSPACE",
    "Backend",
    "ContainerSpec",
    "ContainerState",
    "ContainerSummary",
    "ExecResult",
    "ExecSpec",
    "ExecStream",
    "ImageSource",
    "SnapshotImage",
    "check_exec_spec",
    "run_to_completion",
]

SANDBOX_UID = 10001
WORKSPACE = "/workspace"
HOME = "/home/sandbox"

# Labels every container carries, so a sweep finds what belongs to whom.
LABEL_SESSION = "sandhold.session"
LABEL_TENANT = "sandhold.tenant"
LABEL_ORCHESTRATOR = "sandhold.orchestrator"
LABEL_POLICY_HASH = "sandhold.policy-hash"
LABEL_POLICY_NAME = "sandhold.policy"
# The orchestrator label of the project's earlier name: a start still finds the containers of
# its id made before the rename and reaps them, so an upgrade leaks nothing.
LEGACY_LABEL_ORCHESTRATOR = "s" + "bx.orchestrator"
# The snapshot id on a snapshot's image, so a sweep finds the images no registry row names.
LABEL_SNAPSHOT = "sandhold.snapshot"
# The orchestrator whose registry names the snapshot: a key of its own, never
# ``LABEL_ORCHESTRATOR``, which marks session containers for the reconcile to adopt or reap.
LABEL_SNAPSHOT_ORCHESTRATOR = "sandhold.snapshot-orchestrator"
# Where a snapshot image holds the archive of the session's tmpfs roots (which no commit
# captures): outside every tmpfs mount, so a session made from the image sees it.
SNAPSHOT_FILES = "/.sandhold-snapshot/files.tar"

STDOUT = 1
STDERR = 2


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """One session container to create: the policy decides every limit, the rest is identity."""

    image: str
    policy: Policy
    session_id: str
    tenant: str
    orchestrator_id: str
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return {
            **self.extra_labels,
            LABEL_SESSION: self.session_id,
            LABEL_TENANT: self.tenant,
            LABEL_ORCHESTRATOR: self.orchestrator_id,
            LABEL_POLICY_HASH: self.policy.hash,
            LABEL_POLICY_NAME: self.policy.name,
        }


@dataclass(frozen=True, kw_only=True)
class ExecSpec:
    """One command to run in a container: argv only, never a shell string built on the host."""

    argv: Sequence[str]
    tty: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = WORKSPACE


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool = False
    timed_out: bool = False


@dataclass(frozen=True)
class ContainerState:
    status: str
    running: bool
    oom_killed: bool
    exit_code: int | None
    pid: int | None


@dataclass(frozen=True)
class ContainerSummary:
    id: str
    labels: dict[str, str]
    state: str
    created: float


@dataclass(frozen=True)
class SnapshotImage:
    """An image made of a session's container (``commit_container``)."""

    reference: str
    labels: dict[str, str]
    # What the image adds to the one its container was made from (its commit and archive).
    size_bytes: int


class ExecStream(Protocol):
    """An attached exec: stdin in, (stream, bytes) chunks out. ``receive`` returns None at EOF."""

    exec_id: str

    async def send(self, data: bytes) -> None: ...

    async def send_eof(self) -> None: ...

    async def receive(self) -> tuple[int, bytes] | None: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    """A container engine, as the session manager and a session's parts use it. Container ids and
    exec ids are the engine's; labels are plain strings (``key`` or ``key=value`` filters)."""

    # -- the engine ------------------------------------------------------------------------

    async def ping(self) -> None:
        """Return if the engine answers; ``BackendUnavailableError`` if it does not."""
        ...

    async def aclose(self) -> None:
        """Release the connection to the engine (containers are left as they are)."""
        ...

    # -- containers ------------------------------------------------------------------------

    async def create_container(self, spec: ContainerSpec) -> str:
        """Create and start a session container; on any failure nothing is left behind."""
        ...

    async def remove_container(self, container_id: str) -> None:
        """Force-remove the container, ending its execs and closing their streams; one already
        gone is not an error."""
        ...

    async def container_state(self, container_id: str) -> ContainerState: ...

    async def network_log(self, container_id: str) -> list[dict[str, Any]]:
        """The egress attempts of the container's session, oldest first (``network_log``'s
        fields); empty for a session without a network."""
        ...

    async def set_egress_allow(self, container_id: str, allow: list[str]) -> None:
        """Replace the allowlist the session's egress proxy applies to new connections; the
        caller has checked it against the policy (``policy.egress``)."""
        ...

    async def egress_counters(self, container_id: str) -> EgressCounters | None:
        """The totals of the session's egress proxy since it started (bytes each way, refusals
        by rule); None for a session without a network or totals that cannot be read."""
        ...

    async def final_egress_counters(self, container_id: str) -> EgressCounters | None:
        """The session's last read of its egress proxy, at its end: the proxy refuses every
        attempt and closes every connection from now on, and the totals count every byte it
        moved; None as for ``egress_counters``."""
        ...

    async def set_egress_refusal(self, container_id: str, rule: str | None) -> None:
        """Make the session's egress proxy refuse every new attempt with ``rule`` and close its
        open connections; None lifts the refusal."""
        ...

    async def reap_egress(self, orchestrator_id: str, keep: set[str]) -> list[str]:
        """Remove egress left behind by sessions whose container is gone (this orchestrator's
        unless their session id is in ``keep``); the session ids whose egress went."""
        ...

    async def list_containers(self, labels: Mapping[str, str]) -> list[str]:
        """The ids of every container (running or not) carrying all of these labels."""
        ...

    async def describe_containers(self, labels: Sequence[str]) -> list[ContainerSummary]:
        """Every container carrying all of these label filters (``key`` or ``key=value``)."""
        ...

    async def pause(self, container_id: str) -> None:
        """Freeze every process of the container; ``BackendError`` if it is paused already."""
        ...

    async def unpause(self, container_id: str) -> None:
        """Thaw a paused container; ``BackendError`` if it is not paused."""
        ...

    async def stats(self, container_id: str) -> dict[str, float]:
        """``memory_bytes``, ``memory_limit_bytes``, ``pids`` and ``cpu_seconds`` (CPU time used
        since the container started) of a running container."""
        ...

    async def oom_kills(self, container_id: str, *, since: float, until: float) -> int:
        """How many OOM kills the engine saw in the container between two wall-clock times."""
        ...

    # -- snapshot images -------------------------------------------------------------------

    async def commit_container(
        self,
        container_id: str,
        *,
        reference: str,
        labels: Mapping[str, str],
        files: Path | None = None,
    ) -> SnapshotImage:
        """Make an image of the container as it is now, tagged ``reference`` and carrying
        ``labels``: its writable layer (tmpfs mounts are not part of it), and ``files`` (a tar
        archive on this host) at ``SNAPSHOT_FILES``, readable by the sandbox user; a session
        container made from ``reference`` starts from it. On any failure nothing is left
        behind. ``NotSupportedError`` where the engine cannot make images."""
        ...

    async def remove_image(self, reference: str) -> bool:
        """Remove an image ``commit_container`` made; True once it is gone (one gone already
        too), False when a container still uses it (it stays for a later sweep).
        ``NotSupportedError`` as for ``commit_container``."""
        ...

    async def list_images(self, labels: Sequence[str]) -> list[SnapshotImage]:
        """The images carrying every label filter (``key`` or ``key=value``), by the reference
        ``commit_container`` gave them (``size_bytes``: the image's whole size).
        ``NotSupportedError`` as for ``commit_container``."""
        ...

    # -- execs -----------------------------------------------------------------------------

    async def open_exec(self, container_id: str, spec: ExecSpec) -> ExecStream:
        """Start ``spec`` in the container as the sandbox user, attached; a malformed spec is
        ``InvalidArgumentError`` before the engine is asked (``check_exec_spec``)."""
        ...

    async def exec_exit_code(self, exec_id: str) -> int | None:
        """The exit code once the exec has ended, None while it runs."""
        ...

    async def wait_exec_exit(self, exec_id: str, *, timeout: float) -> int | None:
        """The exit code of an exec whose stream has ended; None if it still runs at the
        timeout (the stream can end a moment before the engine records the code)."""
        ...

    async def exec_resize(self, exec_id: str, *, rows: int, cols: int) -> None:
        """Set the window size of a TTY exec."""
        ...

    async def run(
        self, container_id: str, spec: ExecSpec, *, timeout: float, max_output_bytes: int
    ) -> ExecResult:
        """Run to completion with stdin closed (``run_to_completion``)."""
        ...


class ImageSource(Protocol):
    """Where a backend's session images come from: the reference (tag, digest, name the nodes
    know) of a template's current image. Docker's builds what is missing (``images/``); a
    backend that builds nothing knows only the references it was configured with."""

    async def image_for(self, template: str) -> str:
        """The reference of ``template``'s current image, made first where this source can;
        ``TemplateNotBuiltError`` when it has none and makes none."""
        ...

    async def check_image(self, reference: str) -> bool | None:
        """Whether the engine has the image (``/readyz``); None when this source cannot tell."""
        ...


def check_exec_spec(spec: ExecSpec) -> None:
    """Refuse an exec no engine should be asked for: an empty argv, NUL bytes, a relative
    working directory."""
    if not spec.argv or not all(isinstance(arg, str) and arg for arg in spec.argv[:1]):
        raise InvalidArgumentError("an exec needs a non-empty argv")
    if any("\0" in arg for arg in spec.argv):
        raise InvalidArgumentError("exec arguments must not contain NUL bytes")
    if not spec.workdir.startswith("/"):
        raise InvalidArgumentError("exec working directory must be absolute")


# The stream has ended when this is asked, so the engine has the code or is about to.
RUN_EXIT_TIMEOUT = 5.0


async def run_to_completion(
    backend: Backend, container_id: str, spec: ExecSpec, *, timeout: float, max_output_bytes: int
) -> ExecResult:
    """``Backend.run`` in terms of the other methods: stdin closed, output beyond the cap per
    stream counted as truncation rather than kept, the exit code None on a timeout."""
    stream = await backend.open_exec(container_id, spec)
    out, err = bytearray(), bytearray()
    truncated = timed_out = False
    try:
        await stream.send_eof()
        with anyio.move_on_after(timeout) as scope:
            while (chunk := await stream.receive()) is not None:
                target = err if chunk[0] == STDERR else out
                room = max_output_bytes - len(target)
                truncated |= len(chunk[1]) > room
                target += chunk[1][: max(room, 0)]
        timed_out = scope.cancelled_caught
    finally:
        await stream.aclose()
    exit_code = (
        None
        if timed_out
        else await backend.wait_exec_exit(stream.exec_id, timeout=RUN_EXIT_TIMEOUT)
    )
    return ExecResult(exit_code, bytes(out), bytes(err), truncated, timed_out)
