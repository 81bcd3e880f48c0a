"""The ``Backend`` contract (``orchestrator/backend/base.py``), stated once and held against every
backend: Docker under runc, Docker under runsc (gVisor), Kubernetes (the cluster of
``.ci/kube-cluster``: a Pod per container, execs through the API server), and the in-memory fake.

Under runsc the suite runs when the engine lists it, and follows ``test_runsc.py``: skipped with
the reason when the engine has no runsc, failed under CI when it lists runsc but nothing starts.
The fake has no kernel: each command the suite runs is scripted for it (``FAKE_PROGRAMS``) to do
what the real one does, so what holds the fake to the contract is everything around the command:
labels, states, streams, stdin and EOF, exit codes, the TTY's single stream, the size a resize
sets, and the error types. Everything a real kernel decides is left to the Docker parameters.

Kubernetes cannot freeze a Pod: there the contract is that ``pause`` is refused
(``InvalidArgumentError``, as is a policy that would need it), never faked.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from orchestrator.backend.base import (
    LABEL_SESSION,
    SNAPSHOT_FILES,
    STDERR,
    STDOUT,
    Backend,
    ContainerSpec,
    ExecSpec,
    ExecStream,
)
from orchestrator.backend.docker import DockerBackend, DockerClient
from orchestrator.backend.fake import FakeBackend, FakeProcess, Program, ProgramRun
from orchestrator.backend.kubernetes import KubernetesBackend
from orchestrator.errors import (
    BackendError,
    ContainerNotFoundError,
    InvalidArgumentError,
    NotSupportedError,
)
from orchestrator.policy.model import Policy, load_policy
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.kubernetes.cluster import Cluster, kill_pod_container

pytestmark = [pytest.mark.anyio]

MIB = 1024 * 1024
# Every wait on a container is bounded; a start under gVisor on a loaded host takes seconds.
STEP_TIMEOUT = 60.0
RUN_TIMEOUT = 30.0
MAX_OUTPUT = 64 * 1024
# What a container killed from outside (SIGKILL) reports as its exit code.
KILLED_EXIT = 137
MARKER = "sandhold.test-conformance"

OUT_ERR_EXIT = ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]
DIGITS = ["/bin/sh", "-c", "printf 0123456789"]
CAT = ["cat"]
TTY_PROBE = ["/bin/sh", "-c", "test -t 1 && echo tty; echo err >&2"]
WINDOW_SIZE = ["/bin/sh", "-c", "read _; stty size"]


def _out_err_exit(process: FakeProcess) -> int:
    process.write(b"out\n")
    process.write(b"err\n", STDERR)
    return 3


def _digits(process: FakeProcess) -> int:
    process.write(b"0123456789")
    return 0


def _cat(process: FakeProcess) -> ProgramRun:
    while (data := (yield)) is not None:
        process.write(data)
    return 0


def _tty_probe(process: FakeProcess) -> int:
    if process.spec.tty:
        process.write(b"tty\n")
    process.write(b"err\n", STDERR)
    return 0


def _window_size(process: FakeProcess) -> ProgramRun:
    line = b""
    while b"\n" not in line:
        data = yield
        if data is None:
            return 1
        line += data
    rows, cols = process.size or (24, 80)
    process.write(f"{rows} {cols}\n".encode())
    return 0


FAKE_PROGRAMS: list[tuple[Sequence[str], Program]] = [
    (OUT_ERR_EXIT, _out_err_exit),
    (DIGITS, _digits),
    (CAT, _cat),
    (TTY_PROBE, _tty_probe),
    (WINDOW_SIZE, _window_size),
]


@dataclass
class Engine:
    """Which backend a test runs against, resolved before any event loop runs."""

    name: str
    image: str
    policy: Policy
    cluster: Cluster | None = None


@dataclass
class Target:
    """A backend under test, with what the suite does to it from outside."""

    engine: Engine
    backend: Backend
    kill_from_outside: Callable[[str], Awaitable[None] | None]
    created: list[str] = field(default_factory=list)

    async def container(self) -> tuple[str, ContainerSpec]:
        spec = ContainerSpec(
            image=self.engine.image,
            policy=self.engine.policy,
            session_id=secrets.token_hex(16),
            tenant="test",
            orchestrator_id=TEST_ORCHESTRATOR_ID,
            extra_labels={TEST_RUN_LABEL: RUN_ID, MARKER: secrets.token_hex(8)},
        )
        with anyio.fail_after(STEP_TIMEOUT):
            container_id = await self.backend.create_container(spec)
        self.created.append(container_id)
        return container_id, spec

    async def stop(self, container_id: str) -> None:
        """Kill the container from outside the backend, as an operator or the OOM killer does."""
        with anyio.fail_after(STEP_TIMEOUT):
            result = self.kill_from_outside(container_id)
            if isinstance(result, Awaitable):
                await result
            while (await self.backend.container_state(container_id)).running:  # noqa: ASYNC110 (no event for it)
                await anyio.sleep(0.05)


@pytest.fixture(
    params=[
        "fake",
        pytest.param("runc", marks=pytest.mark.docker),
        pytest.param("runsc", marks=pytest.mark.docker),
        pytest.param("kubernetes", marks=pytest.mark.kubernetes),
    ]
)
def engine(request: pytest.FixtureRequest) -> Engine:
    default = load_policy("default")
    if request.param == "fake":
        return Engine("fake", "fake-image", default)
    if request.param == "kubernetes":
        cluster: Cluster = request.getfixturevalue("kube_cluster")
        return Engine("kubernetes", cluster.image, default, cluster)
    image = request.getfixturevalue("worker_image").tag
    if request.param == "runc":
        return Engine("runc", image, default)
    request.getfixturevalue("runsc_works")
    return Engine("runsc", image, default.model_copy(update={"runtime": "runsc"}))


@pytest.fixture
async def target(engine: Engine) -> AsyncIterator[Target]:
    backend: Backend
    if engine.name == "fake":
        fake = FakeBackend()
        for argv, program in FAKE_PROGRAMS:
            fake.program(argv, program)
        target = Target(engine, fake, fake.stop)
    elif engine.cluster is not None:
        cluster = engine.cluster
        target = Target(
            engine,
            KubernetesBackend(cluster.settings()),
            lambda pod: kill_pod_container(cluster, pod),
        )
    else:
        client = DockerClient()
        backend = DockerBackend(client)

        async def kill(container_id: str) -> None:
            await client.call(lambda sdk: sdk.api.kill(container_id))

        target = Target(engine, backend, kill)
    try:
        yield target
    finally:
        with anyio.CancelScope(shield=True):
            for container_id in target.created:
                await target.backend.remove_container(container_id)
            await target.backend.aclose()


async def drain(stream: ExecStream) -> list[tuple[int, bytes]]:
    chunks = []
    with anyio.fail_after(STEP_TIMEOUT):
        while (chunk := await stream.receive()) is not None:
            chunks.append(chunk)
    return chunks


def joined(chunks: list[tuple[int, bytes]], stream: int) -> bytes:
    return b"".join(data for number, data in chunks if number == stream)


# -- containers ----------------------------------------------------------------------------


async def test_a_container_is_found_by_its_labels(target: Target) -> None:
    container_id, spec = await target.container()
    marker = spec.extra_labels[MARKER]
    assert await target.backend.list_containers({MARKER: marker}) == [container_id]
    described = await target.backend.describe_containers(
        [f"{MARKER}={marker}", f"{LABEL_SESSION}={spec.session_id}"]
    )
    assert [c.id for c in described] == [container_id]
    assert spec.labels.items() <= described[0].labels.items()
    assert described[0].state == "running"
    assert abs(described[0].created - time.time()) < STEP_TIMEOUT
    assert container_id in [c.id for c in await target.backend.describe_containers([MARKER])]
    assert await target.backend.list_containers({MARKER: "another-value"}) == []


async def test_a_running_container_says_so(target: Target) -> None:
    container_id, _ = await target.container()
    state = await target.backend.container_state(container_id)
    assert (state.status, state.running, state.exit_code, state.oom_killed) == (
        "running",
        True,
        None,
        False,
    )


async def test_a_container_killed_from_outside_is_stopped_and_takes_no_exec(
    target: Target,
) -> None:
    container_id, _ = await target.container()
    await target.stop(container_id)
    state = await target.backend.container_state(container_id)
    assert (state.status, state.running, state.exit_code) == ("exited", False, KILLED_EXIT)
    with pytest.raises(ContainerNotFoundError):
        await target.backend.open_exec(container_id, ExecSpec(argv=CAT))
    with pytest.raises(ContainerNotFoundError):
        await target.backend.pause(container_id)


async def test_a_removed_container_is_not_found_and_removing_is_idempotent(
    target: Target,
) -> None:
    container_id, spec = await target.container()
    await target.backend.remove_container(container_id)
    with pytest.raises(ContainerNotFoundError):
        await target.backend.container_state(container_id)
    with pytest.raises(ContainerNotFoundError):
        await target.backend.open_exec(container_id, ExecSpec(argv=CAT))
    await target.backend.remove_container(container_id)
    await target.backend.remove_container("0" * 64)
    assert await target.backend.list_containers({MARKER: spec.extra_labels[MARKER]}) == []


async def test_pause_freezes_and_unpause_thaws_and_neither_is_done_twice(target: Target) -> None:
    container_id, _ = await target.container()
    if target.engine.name == "kubernetes":
        for refused in (target.backend.pause, target.backend.unpause):
            with pytest.raises(InvalidArgumentError):
                await refused(container_id)
        assert (await target.backend.container_state(container_id)).status == "running"
        return
    await target.backend.pause(container_id)
    state = await target.backend.container_state(container_id)
    assert (state.status, state.running) == ("paused", True)
    with pytest.raises(BackendError) as twice:
        await target.backend.pause(container_id)
    assert not isinstance(twice.value, ContainerNotFoundError)
    with pytest.raises(BackendError) as frozen:
        await target.backend.open_exec(container_id, ExecSpec(argv=CAT))
    assert not isinstance(frozen.value, ContainerNotFoundError)
    await target.backend.unpause(container_id)
    assert (await target.backend.container_state(container_id)).status == "running"
    with pytest.raises(BackendError) as thawed:
        await target.backend.unpause(container_id)
    assert not isinstance(thawed.value, ContainerNotFoundError)


async def test_stats_give_the_policys_memory_limit_and_no_oom_kill(target: Target) -> None:
    container_id, spec = await target.container()
    stats = await target.backend.stats(container_id)
    assert stats["memory_limit_bytes"] == spec.policy.resources.memory_mb * MIB
    assert stats["memory_bytes"] >= 0 and stats["pids"] >= 0 and stats["cpu_seconds"] >= 0
    now = time.time()
    assert await target.backend.oom_kills(container_id, since=now - 60, until=now + 1) == 0


# -- execs ---------------------------------------------------------------------------------


async def test_an_exec_reports_stdout_stderr_and_its_exit_code(target: Target) -> None:
    container_id, _ = await target.container()
    result = await target.backend.run(
        container_id,
        ExecSpec(argv=OUT_ERR_EXIT),
        timeout=RUN_TIMEOUT,
        max_output_bytes=MAX_OUTPUT,
    )
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)
    assert not result.truncated and not result.timed_out


async def test_output_past_the_cap_is_counted_as_truncation_not_kept(target: Target) -> None:
    container_id, _ = await target.container()
    result = await target.backend.run(
        container_id, ExecSpec(argv=DIGITS), timeout=RUN_TIMEOUT, max_output_bytes=4
    )
    assert (result.stdout, result.truncated, result.exit_code) == (b"0123", True, 0)


async def test_stdin_reaches_the_exec_which_runs_until_eof(target: Target) -> None:
    container_id, _ = await target.container()
    stream = await target.backend.open_exec(container_id, ExecSpec(argv=CAT))
    try:
        await stream.send(b"hello ")
        await stream.send(b"world")
        assert await target.backend.exec_exit_code(stream.exec_id) is None
        await stream.send_eof()
        chunks = await drain(stream)
    finally:
        await stream.aclose()
    assert joined(chunks, STDOUT) == b"hello world"
    assert joined(chunks, STDERR) == b""
    code = await target.backend.wait_exec_exit(stream.exec_id, timeout=STEP_TIMEOUT)
    assert code == 0
    assert await target.backend.exec_exit_code(stream.exec_id) == 0


async def test_a_tty_exec_has_a_terminal_and_one_stream(target: Target) -> None:
    container_id, _ = await target.container()
    stream = await target.backend.open_exec(container_id, ExecSpec(argv=TTY_PROBE, tty=True))
    try:
        chunks = await drain(stream)
    finally:
        await stream.aclose()
    assert {number for number, _ in chunks} == {STDOUT}
    output = joined(chunks, STDOUT)
    assert b"tty" in output and b"err" in output


async def test_a_tty_exec_takes_the_window_size_it_is_given(target: Target) -> None:
    container_id, _ = await target.container()
    stream = await target.backend.open_exec(container_id, ExecSpec(argv=WINDOW_SIZE, tty=True))
    try:
        await target.backend.exec_resize(stream.exec_id, rows=33, cols=77)
        await stream.send(b"\n")
        output = joined(await drain(stream), STDOUT)
    finally:
        await stream.aclose()
    assert b"33 77" in output
    assert await target.backend.wait_exec_exit(stream.exec_id, timeout=STEP_TIMEOUT) == 0
    with pytest.raises(BackendError):
        await target.backend.exec_resize(stream.exec_id, rows=10, cols=10)


async def test_removing_a_container_ends_its_execs_and_releases_their_readers(
    target: Target,
) -> None:
    container_id, _ = await target.container()
    stream = await target.backend.open_exec(container_id, ExecSpec(argv=CAT))
    read: list[list[tuple[int, bytes]]] = []
    try:
        await stream.send(b"up\n")
        with anyio.fail_after(STEP_TIMEOUT):
            assert await stream.receive() == (STDOUT, b"up\n")  # it runs: now take it away
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                read.append(await drain(stream))

            tg.start_soon(reader)
            await anyio.wait_all_tasks_blocked()
            await target.backend.remove_container(container_id)
    finally:
        await stream.aclose()
    assert read == [[]]
    with pytest.raises(ContainerNotFoundError):
        await target.backend.exec_exit_code(stream.exec_id)


@pytest.mark.parametrize(
    "spec",
    [
        ExecSpec(argv=[]),
        ExecSpec(argv=[""]),
        ExecSpec(argv=["echo", "a\0b"]),
        ExecSpec(argv=CAT, workdir="relative"),
    ],
)
async def test_a_malformed_exec_is_refused_before_the_engine_is_asked(
    target: Target, spec: ExecSpec
) -> None:
    with pytest.raises(InvalidArgumentError):
        await target.backend.open_exec("no-such-container", spec)


async def test_an_exec_in_a_container_that_never_was_is_not_found(target: Target) -> None:
    with pytest.raises(ContainerNotFoundError):
        await target.backend.open_exec("0" * 64, ExecSpec(argv=CAT))
    with pytest.raises(ContainerNotFoundError):
        await target.backend.exec_exit_code("0" * 64)


# -- snapshot images -----------------------------------------------------------------------


async def test_a_committed_container_is_an_image_with_its_files_found_and_removed_by_label(
    target: Target, tmp_path: Path
) -> None:
    archive = tmp_path / "files.tar"
    archive.write_bytes(b"archived" * 512)
    if target.engine.name == "kubernetes":  # a Pod cannot be made an image: refused, not faked
        with pytest.raises(NotSupportedError):
            await target.backend.commit_container(
                "0" * 64, reference="sandhold-snapshot:none", labels={}, files=archive
            )
        for refused in (target.backend.list_images([MARKER]), target.backend.remove_image("x")):
            with pytest.raises(NotSupportedError):
                await refused
        return
    container_id, spec = await target.container()
    marker = spec.extra_labels[MARKER]
    reference = f"sandhold-snapshot:conformance-{marker}"
    labels = {TEST_RUN_LABEL: RUN_ID, MARKER: marker}
    with anyio.fail_after(STEP_TIMEOUT * 2):
        image = await target.backend.commit_container(
            container_id, reference=reference, labels=labels, files=archive
        )
    try:
        assert image.reference == reference and labels.items() <= image.labels.items()
        assert image.size_bytes >= archive.stat().st_size
        found = await target.backend.list_images([f"{MARKER}={marker}"])
        assert [i.reference for i in found] == [reference]
        assert await target.backend.list_images([f"{MARKER}=another-value"]) == []

        from_image = ContainerSpec(
            image=reference,
            policy=spec.policy,
            session_id=secrets.token_hex(16),
            tenant="test",
            orchestrator_id=TEST_ORCHESTRATOR_ID,
            extra_labels={TEST_RUN_LABEL: RUN_ID},
        )
        with anyio.fail_after(STEP_TIMEOUT):
            made = await target.backend.create_container(from_image)
        target.created.append(made)
        if target.engine.name != "fake":  # the fake has no files; the kernel's part is Docker's
            read = await target.backend.run(
                made, ExecSpec(argv=["cat", SNAPSHOT_FILES]), timeout=RUN_TIMEOUT,
                max_output_bytes=MAX_OUTPUT,
            )  # fmt: skip
            assert read.exit_code == 0 and read.stdout == archive.read_bytes()
        # An image a container uses stays; once it is gone, so is the image, and again.
        assert await target.backend.remove_image(reference) is False
        await target.backend.remove_container(made)
        assert await target.backend.remove_image(reference) is True
        assert await target.backend.list_images([f"{MARKER}={marker}"]) == []
        assert await target.backend.remove_image(reference) is True
    finally:
        with anyio.CancelScope(shield=True):
            await target.backend.remove_image(reference)
