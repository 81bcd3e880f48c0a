"""An in-memory ``Backend`` for unit tests of the logic above it: quotas, eviction, reconcile,
owners, pools, lifecycle. It has no kernel: a container is a record (labels, state), and an exec
runs a *program* the test scripts for its argv, a Python callable that writes output and ends with
an exit code. Anything that depends on what really happens in a container (isolation, signals,
files, the worker itself) is tested on a real engine, never here.

A program is called with the ``FakeProcess`` it runs as. It either returns its exit code at once
or is a generator: it is advanced to its first ``yield`` when the exec starts, is sent each chunk
of stdin as the exec receives it and None at EOF, and its return value is its exit code::

    def cat(process: FakeProcess) -> Generator[None, bytes | None, int]:
        while (data := (yield)) is not None:
            process.write(data)
        return 0

    backend.program(["cat"], cat)

Invariants: everything is deterministic (ids and pids count up, time is ``clock``); programs run
synchronously inside ``send``/``send_eof``, so no task is ever started; the errors are the ones
the Docker backend raises for the same situation (``tests/docker/test_backend_conformance.py``
holds both to them); an argv no program matches exits 127, as ``sh`` does for a missing command.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from orchestrator.backend.base import (
    STDERR,
    STDOUT,
    ContainerSpec,
    ContainerState,
    ContainerSummary,
    ExecResult,
    ExecSpec,
    SnapshotImage,
    check_exec_spec,
    run_to_completion,
)
from orchestrator.backend.network_log import EgressCounters
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    ContainerNotFoundError,
    NotSupportedError,
)

__all__ = [
    "FakeBackend",
    "FakeContainer",
    "FakeExecStream",
    "FakeProcess",
    "Program",
    "ProgramRun",
]

ProgramRun = Generator[None, bytes | None, int]
Program = Callable[["FakeProcess"], "int | ProgramRun"]

MIB = 1024 * 1024
# What sh answers for a command it cannot find.
NOT_FOUND_EXIT = 127
# SIGKILL's exit status: what a process killed with its container reports.
KILLED_EXIT = 137
# The first pid an exec gets; 1 is the container's init, and the worker protocol wants pid > 1.
FIRST_PID = 100


@dataclass(eq=False)
class FakeContainer:
    id: str
    spec: ContainerSpec | None
    labels: dict[str, str]
    created: float
    status: str = "running"
    exit_code: int | None = None
    oom_killed: bool = False
    # Wall-clock times of OOM kills, for ``oom_kills``; a test appends to it.
    oom_times: list[float] = field(default_factory=list)
    memory_bytes: int = 0
    # CPU time the container has used, for ``stats``; a test sets it.
    cpu_seconds: float = 0.0
    pids: Iterator[int] = field(default_factory=lambda: itertools.count(FIRST_PID))


@dataclass(eq=False)
class FakeProcess:
    """One exec as its program sees it: what it was started with, and where its output goes."""

    exec_id: str
    pid: int
    container: FakeContainer
    spec: ExecSpec
    # The window size last set by ``exec_resize``, as (rows, cols).
    size: tuple[int, int] | None = None
    exit_code: int | None = None
    _output: list[tuple[int, bytes]] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)
    _run: ProgramRun | None = None
    _advancing: bool = False

    @property
    def argv(self) -> Sequence[str]:
        return self.spec.argv

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def write(self, data: bytes, stream: int = STDOUT) -> None:
        """Output of the program; with a TTY, stderr is merged into stdout as a PTY does."""
        if data and self.running:
            self._output.append((STDOUT if self.spec.tty else stream, bytes(data)))
            self.notify()

    def end(self, exit_code: int) -> None:
        """End the process (a kill from a test or a program, or its container going away)."""
        if not self.running:
            return
        self.exit_code = exit_code
        run, self._run = self._run, None
        if run is not None and not self._advancing:  # one ending itself is closed by _advance
            run.close()
        self.notify()

    def start(self, program: Program) -> None:
        """Run ``program`` up to its first wait for stdin (or its end)."""
        outcome = program(self)
        if isinstance(outcome, int):
            self.end(outcome)
            return
        self._run = outcome
        self._advance(lambda: next(outcome))

    def feed(self, data: bytes | None) -> None:
        """Hand the program a chunk of stdin, or None for EOF."""
        run = self._run
        if run is not None:
            self._advance(lambda: run.send(data))

    def _advance(self, step: Callable[[], None]) -> None:
        run = self._run
        try:
            self._advancing = True
            try:
                step()
            finally:
                self._advancing = False
        except StopIteration as stop:
            self.end(stop.value if isinstance(stop.value, int) else 0)
        except BaseException:
            self.end(1)  # the program is broken: the process dies, and the test hears why
            raise
        else:
            if run is not None and not self.running:  # it ended itself while it ran
                run.close()

    def take_output(self) -> tuple[int, bytes] | None:
        return self._output.pop(0) if self._output else None

    async def wait_changed(self) -> None:
        """Until the next output, end, or detach."""
        await self._changed.wait()

    def notify(self) -> None:
        """Wake whoever waits for this process to change."""
        self._changed.set()
        self._changed = anyio.Event()


class FakeExecStream:
    """The attached end of a ``FakeProcess``: stdin goes to its program, output comes back."""

    def __init__(self, backend: FakeBackend, process: FakeProcess) -> None:
        self.exec_id = process.exec_id
        self._backend = backend
        self._process = process
        self._stdin_open = True
        self._closed = False

    async def send(self, data: bytes) -> None:
        self._check_writable()
        self._backend.deliver(self._process, bytes(data))

    async def send_eof(self) -> None:
        # Closing stdin is a half-close of the socket: it succeeds even when the process has
        # ended, and a second one changes nothing.
        if self._closed:
            raise anyio.ClosedResourceError
        was_open, self._stdin_open = self._stdin_open, False
        if was_open and self._process.running:
            self._backend.deliver(self._process, None)

    def _check_writable(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._stdin_open or not self._process.running:
            raise anyio.BrokenResourceError

    async def receive(self) -> tuple[int, bytes] | None:
        process = self._process
        while not self._closed:
            if (chunk := process.take_output()) is not None:
                return chunk
            if not process.running:
                return None
            await process.wait_changed()
        return None

    async def aclose(self) -> None:
        # Like a real detach: the process runs on, unread.
        self._closed = True
        self._process.notify()  # a receive waiting in another task returns None


class FakeBackend:
    """``Backend`` in memory. Tests script programs (``program``), act from outside (``stop``,
    ``kill``, ``add_container``, ``reachable``) and look at ``containers`` and ``processes``."""

    def __init__(
        self,
        *,
        runtimes: frozenset[str] = frozenset({"runc"}),
        clock: Callable[[], float] = time.time,
        snapshots: bool = True,
    ) -> None:
        self.runtimes = runtimes
        self.clock = clock
        # False: an engine that makes no images (as Kubernetes), every image call refused.
        self.snapshots = snapshots
        self.containers: dict[str, FakeContainer] = {}
        # Images made by ``commit_container``, by reference; the size is the archive's.
        self.images: dict[str, SnapshotImage] = {}
        self.processes: dict[str, FakeProcess] = {}
        # False: the engine is down, and every call is backend_unavailable.
        self.reachable = True
        self.closed = False
        self._programs: list[tuple[tuple[str, ...], Program]] = []
        self._ids = itertools.count(1)
        # Input sent to a paused container's processes, delivered when it is thawed.
        self._held: list[tuple[FakeProcess, bytes | None]] = []

    # -- what tests do ---------------------------------------------------------------------

    def program(self, argv_prefix: Sequence[str], program: Program) -> None:
        """Run ``program`` for every exec whose argv starts with ``argv_prefix``; the longest
        prefix wins, and of equal ones the one given last."""
        self._programs.append((tuple(argv_prefix), program))

    def add_container(self, labels: Mapping[str, str], *, status: str = "running") -> str:
        """A container this backend did not create (a leftover, another orchestrator's)."""
        container = self._new_container(None, dict(labels))
        container.status = status
        return container.id

    def stop(self, container_id: str, *, exit_code: int = KILLED_EXIT, oom: bool = False) -> None:
        """Stop a container from outside (a kill, an engine restart, the OOM killer)."""
        container = self._container(container_id)
        container.status, container.exit_code, container.oom_killed = "exited", exit_code, oom
        if oom:
            container.oom_times.append(self.clock())
        for process in self._processes_of(container):
            process.end(KILLED_EXIT)

    def kill(self, container_id: str, pid: int, *, exit_code: int = KILLED_EXIT) -> bool:
        """End the process ``pid`` of a container; False if none such runs."""
        container = self._container(container_id)
        for process in self._processes_of(container):
            if process.pid == pid and process.running:
                process.end(exit_code)
                return True
        return False

    def deliver(self, process: FakeProcess, data: bytes | None) -> None:
        """Hand stdin (None: EOF) to a process's program, or hold it while its container is
        frozen, as a real pause holds the process that would read it."""
        if process.container.status == "paused":
            self._held.append((process, data))
        else:
            process.feed(data)

    # -- the engine ------------------------------------------------------------------------

    async def ping(self) -> None:
        self._check_reachable()

    async def aclose(self) -> None:
        self.closed = True

    # -- containers ------------------------------------------------------------------------

    async def create_container(self, spec: ContainerSpec) -> str:
        self._check_reachable()
        runtime = spec.policy.runtime
        if runtime is not None and runtime not in self.runtimes:
            raise BackendUnavailableError(f"the fake engine has no runtime {runtime!r}")
        return self._new_container(spec, spec.labels).id

    async def remove_container(self, container_id: str) -> None:
        self._check_reachable()
        container = self.containers.pop(container_id, None)
        if container is None:
            return
        for process in self._processes_of(container):
            process.end(KILLED_EXIT)
            del self.processes[process.exec_id]
        self._held = [(p, d) for p, d in self._held if p.container is not container]

    async def network_log(self, container_id: str) -> list[dict[str, Any]]:
        """The fake has no egress proxy: a session's log is always empty."""
        self._known(container_id)
        return []

    async def set_egress_allow(self, container_id: str, allow: list[str]) -> None:
        self._known(container_id)

    async def reap_egress(self, orchestrator_id: str, keep: set[str]) -> list[str]:
        return []

    async def egress_counters(self, container_id: str) -> EgressCounters | None:
        """The fake has no egress proxy: nothing to count."""
        self._known(container_id)
        return None

    async def final_egress_counters(self, container_id: str) -> EgressCounters | None:
        self._known(container_id)
        return None

    async def set_egress_refusal(self, container_id: str, rule: str | None) -> None:
        self._known(container_id)

    async def container_state(self, container_id: str) -> ContainerState:
        container = self._known(container_id)
        running = container.status in ("running", "paused")
        return ContainerState(
            status=container.status,
            running=running,
            oom_killed=container.oom_killed,
            exit_code=None if running else container.exit_code,
            pid=1 if running else None,
        )

    async def list_containers(self, labels: Mapping[str, str]) -> list[str]:
        filters = [f"{key}={value}" for key, value in labels.items()]
        return [c.id for c in await self.describe_containers(filters)]

    async def describe_containers(self, labels: Sequence[str]) -> list[ContainerSummary]:
        self._check_reachable()
        found = [c for c in self.containers.values() if _matches(c.labels, labels)]
        # Newest first, as the engine lists them.
        return [
            ContainerSummary(id=c.id, labels=dict(c.labels), state=c.status, created=c.created)
            for c in reversed(found)
        ]

    async def pause(self, container_id: str) -> None:
        container = self._running(container_id)
        if container.status == "paused":
            raise BackendError(f"container {container_id} is already paused")
        container.status = "paused"

    async def unpause(self, container_id: str) -> None:
        container = self._known(container_id)
        if container.status != "paused":
            raise BackendError(f"container {container_id} is not paused")
        container.status = "running"
        held = [(p, d) for p, d in self._held if p.container is container]
        self._held = [(p, d) for p, d in self._held if p.container is not container]
        for process, data in held:
            process.feed(data)

    async def stats(self, container_id: str) -> dict[str, float]:
        container = self._known(container_id)
        if container.status not in ("running", "paused"):
            return {"memory_bytes": 0.0, "memory_limit_bytes": 0.0, "pids": 0.0, "cpu_seconds": 0.0}
        limit = container.spec.policy.resources.memory_mb * MIB if container.spec else 0
        pids = 1 + sum(1 for p in self._processes_of(container) if p.running)
        return {
            "memory_bytes": float(container.memory_bytes),
            "memory_limit_bytes": float(limit),
            "pids": float(pids),
            "cpu_seconds": container.cpu_seconds,
        }

    async def oom_kills(self, container_id: str, *, since: float, until: float) -> int:
        self._check_reachable()
        container = self.containers.get(container_id)
        if container is None:
            return 0
        return sum(1 for t in container.oom_times if since <= t <= until)

    # -- snapshot images -------------------------------------------------------------------

    async def commit_container(
        self,
        container_id: str,
        *,
        reference: str,
        labels: Mapping[str, str],
        files: Path | None = None,
    ) -> SnapshotImage:
        self._check_images()
        self._running(container_id)
        size = (await anyio.Path(files).stat()).st_size if files is not None else 0
        self.images[reference] = SnapshotImage(reference, dict(labels), size)
        return self.images[reference]

    async def remove_image(self, reference: str) -> bool:
        self._check_images()
        if any(c.spec is not None and c.spec.image == reference for c in self.containers.values()):
            return False
        self.images.pop(reference, None)
        return True

    async def list_images(self, labels: Sequence[str]) -> list[SnapshotImage]:
        self._check_images()
        return [image for image in self.images.values() if _matches(image.labels, labels)]

    def _check_images(self) -> None:
        self._check_reachable()
        if not self.snapshots:
            raise NotSupportedError("the fake engine makes no images (snapshots=False)")

    # -- execs -----------------------------------------------------------------------------

    async def open_exec(self, container_id: str, spec: ExecSpec) -> FakeExecStream:
        check_exec_spec(spec)
        container = self._running(container_id)
        if container.status == "paused":
            raise BackendError(f"container {container_id} is paused, unpause it before exec")
        process = FakeProcess(
            exec_id=f"exec-{next(self._ids):04d}",
            pid=next(container.pids),
            container=container,
            spec=spec,
        )
        self.processes[process.exec_id] = process
        stream = FakeExecStream(self, process)
        process.start(self._program_for(spec.argv))
        return stream

    async def exec_exit_code(self, exec_id: str) -> int | None:
        return self._process(exec_id).exit_code

    async def wait_exec_exit(self, exec_id: str, *, timeout: float) -> int | None:
        process = self._process(exec_id)
        with anyio.move_on_after(timeout):
            while process.running:
                await process.wait_changed()
        return process.exit_code

    async def exec_resize(self, exec_id: str, *, rows: int, cols: int) -> None:
        process = self._process(exec_id)
        if not process.running:
            raise ContainerNotFoundError(f"no such exec: {exec_id} has ended")
        process.size = (rows, cols)

    async def run(
        self, container_id: str, spec: ExecSpec, *, timeout: float, max_output_bytes: int
    ) -> ExecResult:
        return await run_to_completion(
            self, container_id, spec, timeout=timeout, max_output_bytes=max_output_bytes
        )

    # -- inside ----------------------------------------------------------------------------

    def _new_container(self, spec: ContainerSpec | None, labels: dict[str, str]) -> FakeContainer:
        container_id = f"fake-{next(self._ids):04d}"
        container = FakeContainer(id=container_id, spec=spec, labels=labels, created=self.clock())
        self.containers[container_id] = container
        return container

    def _program_for(self, argv: Sequence[str]) -> Program:
        best: tuple[int, Program] | None = None
        for prefix, program in self._programs:
            if tuple(argv[: len(prefix)]) == prefix and (best is None or len(prefix) >= best[0]):
                best = (len(prefix), program)
        return best[1] if best is not None else _not_found

    def _processes_of(self, container: FakeContainer) -> list[FakeProcess]:
        return [p for p in self.processes.values() if p.container is container]

    def _check_reachable(self) -> None:
        if not self.reachable:
            raise BackendUnavailableError("the fake engine is not reachable")

    def _container(self, container_id: str) -> FakeContainer:
        container = self.containers.get(container_id)
        if container is None:
            raise ContainerNotFoundError(f"no such container: {container_id}")
        return container

    def _known(self, container_id: str) -> FakeContainer:
        self._check_reachable()
        return self._container(container_id)

    def _running(self, container_id: str) -> FakeContainer:
        container = self._known(container_id)
        if container.status not in ("running", "paused"):
            raise ContainerNotFoundError(f"container {container_id} is not running")
        return container

    def _process(self, exec_id: str) -> FakeProcess:
        self._check_reachable()
        process = self.processes.get(exec_id)
        if process is None:
            raise ContainerNotFoundError(f"no such exec instance: {exec_id}")
        return process


def _matches(labels: Mapping[str, str], filters: Sequence[str]) -> bool:
    for wanted in filters:
        key, has_value, value = wanted.partition("=")
        if key not in labels or (has_value and labels[key] != value):
            return False
    return True


def _not_found(process: FakeProcess) -> int:
    process.write(f"fake: no program for {list(process.argv)!r}\n".encode(), STDERR)
    return NOT_FOUND_EXIT
