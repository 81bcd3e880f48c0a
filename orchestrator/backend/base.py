"""What a container backend offers the layers above it. Everything here is engine-neutral: the
Docker implementation lives in ``backend/docker``; a fake for pure-logic tests may follow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.policy.model import Policy

__all__ = [
    "HOME",
    "LABEL_ORCHESTRATOR",
    "LABEL_POLICY_NAME",
    "LABEL_SESSION",
    "LABEL_TENANT",
    "SANDBOX_UID",
    "STDERR",
    "STDOUT",
    "WORKSPACE",
    "ContainerSpec",
    "ContainerState",
    "ContainerSummary",
    "ExecResult",
    "ExecSpec",
    "ExecStream",
]

SANDBOX_UID = 10001
WORKSPACE = "/workspace"
HOME = "/home/sandbox"

# Labels every container carries, so a sweep finds what belongs to whom.
LABEL_SESSION = "sbx.session"
LABEL_TENANT = "sbx.tenant"
LABEL_ORCHESTRATOR = "sbx.orchestrator"
LABEL_POLICY_HASH = "sbx.policy-hash"
LABEL_POLICY_NAME = "sbx.policy"

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


class ExecStream(Protocol):
    """An attached exec: stdin in, (stream, bytes) chunks out. ``receive`` returns None at EOF."""

    exec_id: str

    async def send(self, data: bytes) -> None: ...

    async def send_eof(self) -> None: ...

    async def receive(self) -> tuple[int, bytes] | None: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    async def create_container(self, spec: ContainerSpec) -> str: ...

    async def remove_container(self, container_id: str) -> None: ...

    async def container_state(self, container_id: str) -> ContainerState: ...

    async def open_exec(self, container_id: str, spec: ExecSpec) -> ExecStream: ...

    async def exec_exit_code(self, exec_id: str) -> int | None: ...

    async def run(
        self, container_id: str, spec: ExecSpec, *, timeout: float, max_output_bytes: int
    ) -> ExecResult: ...

    async def put_archive(self, container_id: str, path: str, tar_bytes: bytes) -> None: ...

    async def get_archive(self, container_id: str, path: str, *, max_bytes: int) -> bytes: ...

    async def stats(self, container_id: str) -> dict[str, float]: ...

    async def aclose(self) -> None: ...
