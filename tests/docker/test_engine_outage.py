"""The Docker engine goes away under sandhold and comes back (issue: dockerd restarted under
sandhold).

The machine's own dockerd is never touched: the orchestrator reaches the engine through
``tests.engine_proxy``, whose ``cut()`` behaves as a dead daemon (connections refused, every open
one broken) while the containers behind it keep running. What a restart without live-restore
does to containers (they stop) is played by killing the session's container during the cut.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import docker
import pytest

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator.backend.docker import DockerBackend, DockerClient
from orchestrator.errors import BackendUnavailableError
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from orchestrator.tools import ToolResult
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL, ContainerFactory
from tests.engine_proxy import EngineProxy

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# An answer while the engine is down needs no engine at all; seconds mean something waited.
OUTAGE_ANSWER_TIMEOUT = 10.0
# The first call on an old session after the outage may wait out the engine's record of the lost
# worker (worker_process's exit-code wait, 5 s) before it is replaced.
RECOVERY_TIMEOUT = 30.0
# Engine calls of these tests are local and small; a stuck one should fail the test, not hang it.
API_TIMEOUT = 20.0
CASE_LABEL = "sandhold.test-case"


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, docker_engine: None) -> Iterator[EngineProxy]:
    with EngineProxy() as proxy:
        monkeypatch.setenv("DOCKER_HOST", proxy.docker_host)
        yield proxy


@pytest.fixture
async def orch(engine: EngineProxy, worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    """An orchestrator that reaches the engine only through ``engine``; every container it made
    is gone when the test ends."""
    case = secrets.token_hex(6)
    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{case}",
        extra_labels={TEST_RUN_LABEL: RUN_ID, CASE_LABEL: case},
    )
    backend = DockerBackend(DockerClient(api_timeout=API_TIMEOUT))
    try:
        async with Orchestrator(config, backend=backend) as orchestrator:
            try:
                yield orchestrator
            finally:
                engine.restore()  # teardown needs the engine: a failed test may leave it cut
        assert await backend.list_containers({CASE_LABEL: case}) == []
    finally:
        await backend.aclose()


async def cut(engine: EngineProxy) -> None:
    await anyio.to_thread.run_sync(engine.cut)


async def call(orch: Orchestrator, tool: str, timeout: float, **args: Any) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        result = await orch.call(tool, args)
    return result.structured


async def new_session(orch: Orchestrator) -> str:
    """A session with state everywhere: a variable, a shell in /tmp, a file."""
    first = await call(orch, "python_repl", 60, operation="execute", code="x = 41")
    assert first["success"], first
    sid: str = first["session_id"]
    shell = await call(orch, "terminal", 60, operation="run", command="cd /tmp", session_id=sid)
    assert shell["success"] and shell["exit_code"] == 0, shell
    wrote = await call(
        orch, "files", 60, operation="write", session_id=sid, path="kept.txt", content="kept"
    )
    assert wrote["success"], wrote
    return sid


def assert_unavailable(answer: dict[str, Any]) -> None:
    assert answer["success"] is False, answer
    assert answer["error_type"] == "backend_unavailable", answer
    assert answer["error_message"]


async def recovered_repl(orch: Orchestrator, sid: str) -> list[dict[str, Any]]:
    """Calls on an old session until it answers, at most two: the first may report the worker
    lost in the outage (``process_crashed``), the next must work."""

    async def execute() -> dict[str, Any]:
        args = {"operation": "execute", "code": "40 + 2", "session_id": sid}
        return await call(orch, "python_repl", RECOVERY_TIMEOUT, **args)

    answers = [await execute()]
    if not answers[0]["success"]:
        assert answers[0]["error_type"] == "process_crashed", answers[0]
        assert answers[0]["state_reset"] is True, answers[0]
        answers.append(await execute())
    assert answers[-1]["success"] and answers[-1]["result_repr"] == "42", answers[-1]
    return answers


async def test_while_the_engine_is_down_every_engine_call_is_backend_unavailable_at_once(
    orch: Orchestrator, engine: EngineProxy
) -> None:
    sid = await new_session(orch)
    await cut(engine)

    calls: list[tuple[str, dict[str, Any]]] = [
        ("python_repl", {"operation": "execute", "code": "x + 1", "session_id": sid}),
        ("python_repl", {"operation": "execute", "code": "1 + 1"}),
        ("terminal", {"operation": "run", "command": "pwd", "session_id": sid}),
        ("files", {"operation": "read", "session_id": sid, "path": "kept.txt"}),
        ("process", {"operation": "list", "session_id": sid}),
    ]
    for tool, args in calls:
        assert_unavailable(await call(orch, tool, OUTAGE_ANSWER_TIMEOUT, **args))


async def test_listing_sessions_needs_no_engine_and_still_answers(
    orch: Orchestrator, engine: EngineProxy
) -> None:
    sid = await new_session(orch)
    await cut(engine)

    listed = await call(orch, "python_repl", OUTAGE_ANSWER_TIMEOUT, operation="list_sessions")

    assert listed["success"], listed
    assert [s["session_id"] for s in listed["sessions"]] == [sid]


async def test_when_the_engine_is_back_new_sessions_work_and_old_ones_recover(
    orch: Orchestrator, engine: EngineProxy
) -> None:
    sid = await new_session(orch)
    await cut(engine)
    for tool, args in [
        ("python_repl", {"operation": "execute", "code": "x + 1", "session_id": sid}),
        ("terminal", {"operation": "run", "command": "pwd", "session_id": sid}),
    ]:
        assert_unavailable(await call(orch, tool, OUTAGE_ANSWER_TIMEOUT, **args))
    engine.restore()

    fresh = await call(orch, "python_repl", 60, operation="execute", code="1 + 1")
    assert fresh["success"] and fresh["result_repr"] == "2", fresh
    # The interpreter outlived the outage (only its stream was lost): the next call re-adopts
    # it through a relay, its variables intact, and nothing claims a reset.
    state = await call(orch, "python_repl", 60, operation="execute", code="x", session_id=sid)
    assert state["success"] and state["result_repr"] == "41", state
    assert not state["state_reset"], state
    answers = await recovered_repl(orch, sid)
    assert len(answers) == 1 and not answers[0]["state_reset"], answers
    shell = await call(orch, "terminal", 60, operation="run", command="pwd", session_id=sid)
    assert shell["success"] and shell["exit_code"] == 0, shell
    kept = await call(orch, "files", 60, operation="read", session_id=sid, path="kept.txt")
    assert kept["success"] and kept["content"] == "kept", kept


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        (
            "python_repl",
            {
                "operation": "execute",
                "code": "import time\ntime.sleep(120)  # {m}",
                "timeout_s": 200,
            },
        ),
        ("terminal", {"operation": "run", "command": "sleep 120; : {m}", "timeout_s": 200}),
    ],
    ids=["python_repl-execute", "terminal-run"],
)
async def test_a_call_in_flight_when_the_engine_dies_is_backend_unavailable_not_a_hang(
    orch: Orchestrator, engine: EngineProxy, tool: str, args: dict[str, Any]
) -> None:
    sid = await new_session(orch)
    marker = f"inflight{secrets.token_hex(8)}"
    forwarded = engine.watch(marker.encode())
    request = {k: v.format(m=marker) if isinstance(v, str) else v for k, v in args.items()}
    answers: list[ToolResult] = []
    answered = anyio.Event()

    async def in_flight() -> None:
        answers.append(await orch.call(tool, {"session_id": sid, **request}))
        answered.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(in_flight)
        assert await anyio.to_thread.run_sync(forwarded.wait, 30.0)
        assert not answered.is_set()
        with anyio.fail_after(OUTAGE_ANSWER_TIMEOUT):
            await cut(engine)
            await answered.wait()
    assert_unavailable(answers[0].structured)

    engine.restore()
    await recovered_repl(orch, sid)


async def test_a_session_whose_container_stopped_with_the_engine_is_lost(
    orch: Orchestrator, engine: EngineProxy
) -> None:
    """A dockerd restart without live-restore stops every container: the session is lost, and
    says so (``session_lost``), while new sessions work."""
    sid = await new_session(orch)
    container_id = orch.find_session(sid).container_id
    await cut(engine)
    await anyio.to_thread.run_sync(_kill_behind_the_proxy, engine.upstream, container_id)
    engine.restore()

    repl = await call(
        orch, "python_repl", RECOVERY_TIMEOUT, operation="execute", code="1", session_id=sid
    )
    if repl["error_type"] == "process_crashed":  # the lost worker is reported first
        repl = await call(orch, "python_repl", 60, operation="execute", code="1", session_id=sid)
    assert repl["error_type"] == "session_lost", repl
    for tool, args in [
        ("files", {"operation": "read", "path": "kept.txt"}),
        ("process", {"operation": "list"}),
    ]:
        answer = await call(orch, tool, 60, session_id=sid, **args)
        assert answer["error_type"] == "session_lost", answer
    fresh = await call(orch, "python_repl", 60, operation="execute", code="1 + 1")
    assert fresh["success"] and fresh["result_repr"] == "2", fresh


def _kill_behind_the_proxy(upstream: str, container_id: str) -> None:
    client = docker.DockerClient(base_url=f"unix://{upstream}", timeout=30)
    try:
        client.api.kill(container_id)
        client.api.wait(container_id, timeout=30)
    finally:
        client.close()


async def test_an_engine_call_in_flight_when_the_engine_dies_is_backend_unavailable(
    engine: EngineProxy, docker_client: DockerClient, make_container: ContainerFactory
) -> None:
    """The SDK's request breaks mid-way, and the same client works once the engine is back."""
    container_id = await make_container(load_policy("default"))
    waiting = engine.watch(f"/containers/{container_id}/wait".encode())
    caught: list[BackendUnavailableError] = []

    async def in_flight() -> None:
        # The container never exits by itself: the call waits until the engine goes away.
        try:
            await docker_client.call(lambda sdk: sdk.api.wait(container_id, timeout=None))
        except BackendUnavailableError as exc:
            caught.append(exc)

    try:
        with anyio.fail_after(OUTAGE_ANSWER_TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(in_flight)
                assert await anyio.to_thread.run_sync(waiting.wait, OUTAGE_ANSWER_TIMEOUT)
                await cut(engine)
        assert len(caught) == 1
        with pytest.raises(BackendUnavailableError):
            await docker_client.ping()
    finally:
        engine.restore()
    await docker_client.ping()


def test_the_proxy_refuses_new_connections_and_breaks_open_ones_when_cut(
    engine: EngineProxy,
) -> None:
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with held:
        held.connect(str(engine.path))
        held.sendall(b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
        assert held.recv(64).startswith(b"HTTP/1.1 200")
        engine.cut()
        held.settimeout(OUTAGE_ANSWER_TIMEOUT)
        while held.recv(4096):  # what the engine had already sent, then the end
            pass
    refused = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with refused, pytest.raises(ConnectionRefusedError):
        refused.connect(str(engine.path))
    engine.restore()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as again:
        again.connect(str(engine.path))
