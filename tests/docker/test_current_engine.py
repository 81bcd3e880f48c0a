"""sandhold against a current Docker engine (29+, which refuses API versions below 1.44), played by
``tests.current_engine`` in front of the real one, over unix:// and tcp://: every request,
the raw exec upgrades included, speaks the version the SDK negotiated."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator.backend.docker import DockerBackend, DockerClient
from orchestrator.backend.docker._endpoint import EngineEndpoint
from orchestrator.errors import BackendUnavailableError
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.current_engine import ADVERTISED, CurrentEngine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CALL_TIMEOUT = 60.0
CASE_LABEL = "sandhold.test-case"


@pytest.fixture(params=["unix", "tcp"])
def engine(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, docker_engine: None
) -> Iterator[CurrentEngine]:
    with CurrentEngine() as current:
        host = current.docker_host if request.param == "unix" else current.tcp_host
        monkeypatch.setenv("DOCKER_HOST", host)
        yield current


@pytest.fixture
async def orch(
    engine: CurrentEngine, worker_image: ImageBuildResult
) -> AsyncIterator[Orchestrator]:
    case = secrets.token_hex(6)
    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{case}",
        extra_labels={TEST_RUN_LABEL: RUN_ID, CASE_LABEL: case},
    )
    backend = DockerBackend(DockerClient())
    try:
        async with Orchestrator(config, backend=backend) as orchestrator:
            yield orchestrator
        assert await backend.list_containers({CASE_LABEL: case}) == []
    finally:
        await backend.aclose()


async def ok(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        result = await orch.call(tool, args)
    assert result.structured["success"], result.structured
    return result.structured


async def test_every_interface_of_a_session_works_through_an_engine_that_refuses_1_41(
    orch: Orchestrator, engine: CurrentEngine
) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="x = 6 * 7"))["session_id"]
    assert (await ok(orch, "python_repl", operation="execute", code="x", session_id=sid))[
        "result_repr"
    ] == "42"
    ran = await ok(orch, "terminal", operation="run", session_id=sid, command="echo hi; cd /tmp")
    assert ran["exit_code"] == 0, ran
    started = await ok(orch, "terminal", operation="start", session_id=sid, command="echo term")
    waited = await ok(
        orch, "terminal", operation="wait", terminal_id=started["terminal_id"], timeout_ms=20000
    )
    assert "term" in started["output"] + waited["output"]
    proc = await ok(orch, "process", operation="start", session_id=sid, command="echo proc")
    listed = await ok(orch, "process", operation="list", session_id=sid)
    assert proc["process_id"] in {p["process_id"] for p in listed["processes"]}
    await ok(orch, "files", operation="write", session_id=sid, path="a/b.txt", content="körper")
    assert (await ok(orch, "files", operation="read", session_id=sid, path="a/b.txt"))[
        "content"
    ] == "körper"
    await ok(orch, "python_repl", operation="destroy", session_id=sid)

    exec_starts = [line for line in engine.requests if "/exec/" in line and "/start" in line]
    assert exec_starts, engine.requests
    assert all(line.split()[1].startswith(f"/v{ADVERTISED}/") for line in exec_starts)
    assert not [line for line in engine.requests if "/v1.41/" in line]


async def test_a_transport_attach_cannot_use_is_backend_unavailable_naming_it() -> None:
    endpoint = EngineEndpoint(url="npipe:////./pipe/docker_engine", api_version=ADVERTISED)
    with anyio.fail_after(CALL_TIMEOUT), pytest.raises(BackendUnavailableError) as caught:
        await endpoint.connect()
    assert caught.value.code == "backend_unavailable"
    assert "npipe" in str(caught.value)
