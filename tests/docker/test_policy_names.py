"""A policy argument is a name, never a file: through every interface of a real ``sandhold serve``
(REST, MCP, the ``Sandbox`` API, ``sandhold call`` and E2B's control API), a policy or template
given as a path, a FIFO, ``/dev/zero`` or ``../`` answers one error with one message, opens
nothing (a FIFO the server opened would have a reader) and blocks nothing (``/healthz``
answers throughout)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator.errors import InvalidArgumentError
from orchestrator.images import ImageBuildResult
from orchestrator.sandbox import AsyncSandbox
from tests.docker.e2b_server import E2bServer, e2b_server
from tests.docker.test_mcp_http import client_with_key

pytestmark = pytest.mark.docker

NOT_A_NAME = "policy must be the name of a policy"
# Every refusal here is decided before any engine work: far less than this even when loaded.
ANSWER_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("names"), set_env=False) as served:
        yield served


@pytest.fixture(scope="module")
def fifo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fifo") / "policy.toml"
    os.mkfifo(path)
    return path


def bad_names(fifo: Path) -> list[str]:
    return [str(fifo), str(fifo.with_suffix("")), "/dev/zero", "../policies/default",
            "/etc/passwd", "default.toml", "./default"]  # fmt: skip


def assert_never_opened(fifo: Path) -> None:
    """Opening a FIFO's write end without blocking fails with ENXIO while nobody reads it."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        no_reader = exc.errno == errno.ENXIO
    else:
        no_reader = False
    assert no_reader, f"{fifo} has a reader: the server opened it"


async def assert_healthy(server: E2bServer) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        assert (await http.get(f"{server.rest_url}/healthz")).status_code == 200


ARGUMENTS = [
    ("terminal", {"operation": "run", "command": "true"}),
    ("terminal", {"operation": "start", "command": "true"}),
    ("python_repl", {"operation": "execute", "code": "1"}),
    ("session", {"operation": "create"}),
]


@pytest.mark.anyio
async def test_rest_refuses_every_path_as_a_policy_alike(server: E2bServer, fifo: Path) -> None:
    headers = {"Authorization": f"Bearer {server.keys['team-a']}"}
    async with httpx.AsyncClient(headers=headers, timeout=ANSWER_TIMEOUT) as http:
        for tool, arguments in ARGUMENTS:
            for bad in bad_names(fifo):
                with anyio.fail_after(ANSWER_TIMEOUT):
                    answer = await http.post(
                        f"{server.rest_url}/v1/{tool}", json={**arguments, "policy": bad}
                    )
                body = answer.json()
                assert answer.status_code == 400, (tool, bad, body)
                assert (body["error_type"], body["error_message"]) == (
                    "invalid_argument",
                    NOT_A_NAME,
                ), (tool, bad)
                await assert_healthy(server)
    assert_never_opened(fifo)


@pytest.mark.anyio
async def test_an_unknown_name_is_one_error_whatever_exists_on_the_host(
    server: E2bServer, tmp_path: Path
) -> None:
    """A name is looked up among the loaded policies only: a file of that name beside the
    server's working directory or anywhere else changes nothing."""
    headers = {"Authorization": f"Bearer {server.keys['team-a']}"}
    async with httpx.AsyncClient(headers=headers, timeout=ANSWER_TIMEOUT) as http:
        answers = set()
        for name in ("passwd", "nosuchpolicy", "hosts"):
            answer = await http.post(
                f"{server.rest_url}/v1/terminal",
                json={"operation": "run", "command": "true", "policy": name},
            )
            body = answer.json()
            answers.add(
                (answer.status_code, body["error_type"], body["error_message"].replace(name, "N"))
            )
    assert answers == {(400, "invalid_argument", "unknown policy 'N'")}


@pytest.mark.anyio
async def test_mcp_refuses_every_path_as_a_policy_alike(server: E2bServer, fifo: Path) -> None:
    async with client_with_key(f"{server.rest_url}/mcp", server.keys["team-a"]) as client:
        for tool, arguments in ARGUMENTS:
            for bad in bad_names(fifo):
                with anyio.fail_after(ANSWER_TIMEOUT):
                    result = await client.call_tool(tool, {**arguments, "policy": bad})
                assert result.is_error, (tool, bad)
                content = result.structured_content or {}
                assert (content["error_type"], content["error_message"]) == (
                    "invalid_argument",
                    NOT_A_NAME,
                ), (tool, bad)
    await assert_healthy(server)
    assert_never_opened(fifo)


@pytest.mark.anyio
async def test_the_sandbox_api_refuses_every_path_as_a_policy_alike(
    server: E2bServer, fifo: Path
) -> None:
    for bad in bad_names(fifo):
        with anyio.fail_after(ANSWER_TIMEOUT), pytest.raises(InvalidArgumentError) as caught:
            await AsyncSandbox.create(
                policy=bad, url=server.rest_url, api_key=server.keys["team-a"]
            )
        assert (caught.value.error_type, caught.value.message) == ("invalid_argument", NOT_A_NAME)
    await assert_healthy(server)
    assert_never_opened(fifo)


def test_sandhold_call_refuses_every_path_as_a_policy_alike(server: E2bServer, fifo: Path) -> None:
    for bad in bad_names(fifo):
        arguments = json.dumps({"operation": "run", "command": "true", "policy": bad})
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "call", "terminal", arguments,
             "--server", server.rest_url, "--key", server.keys["team-a"], "--json"],
            capture_output=True, text=True, timeout=ANSWER_TIMEOUT, check=False,
        )  # fmt: skip
        assert done.returncode != 0, done
        answer = json.loads(done.stdout)
        assert (answer["error_type"], answer["error_message"]) == ("invalid_argument", NOT_A_NAME)
    assert_never_opened(fifo)


@pytest.mark.anyio
async def test_e2b_refuses_every_path_as_a_template_alike(server: E2bServer, fifo: Path) -> None:
    headers = {"X-API-Key": server.keys["team-a"]}
    async with httpx.AsyncClient(headers=headers, timeout=ANSWER_TIMEOUT) as http:
        seen = set()
        for bad in bad_names(fifo):
            with anyio.fail_after(ANSWER_TIMEOUT):
                answer = await http.post(f"{server.url}/sandboxes", json={"templateID": bad})
            seen.add((answer.status_code, answer.json()["message"].replace(bad, "T")))
            await assert_healthy(server)
    assert seen == {(404, "template 'T' not found")}
    assert_never_opened(fifo)
