"""A template's first use says what it is doing (issue 32.6): a call whose session needs an image
built first is told, before anything else, that a one-time build starts and about how long it
takes, then each step, and the next session of that template is told nothing. Through a real
MCP client (progress notifications of the call), through ``sandhold run`` (its stderr) and
through REST's streamed create (``build`` events),
against a user template whose image no run has built before (an env value of its own)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from orchestrator._api import Orchestrator
from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.http import build_app
from orchestrator.images import ImageBuildResult
from orchestrator.images.templates import load_catalog
from orchestrator.mcp_server.server import build_mcp_server
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.docker.test_http_api import KEY_A, KEYS, serving
from tests.docker.test_python_repl import config
from tests.docker.test_templates import SIX

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# A template of one cached wheel over the worker image: a build, a container and a cell.
SCENARIO_TIMEOUT = 300.0
NOTICE = "one-time build of template"


@pytest.fixture
def quick_template(tmp_path: Path) -> tuple[Path, Path]:
    """A template no run has built (its env differs every time) and a policy that uses it:
    (the template folder, the policy file)."""
    templates, policies = tmp_path / "templates", tmp_path / "policies"
    templates.mkdir()
    policies.mkdir()
    mark = secrets.token_hex(8)
    (templates / "firstuse.toml").write_text(f'pip = ["{SIX}"]\n[env]\nFIRST_USE = "{mark}"\n')
    policy = policies / "uses-firstuse.toml"
    policy.write_text('extends = "default"\n[image]\ntemplate = "firstuse"\n')
    return templates, policy


@pytest.fixture
async def removes_its_image(
    worker_image: ImageBuildResult, quick_template: tuple[Path, Path]
) -> AsyncIterator[None]:
    """The template's image, removed after the test (only this test made it)."""
    yield
    from orchestrator.images.template_build import image_identity, template_hashes, template_tag

    client = DockerClient()
    try:
        base = await image_identity(client, worker_image.tag)
        digest = template_hashes(load_catalog([quick_template[0]]), base)["firstuse"]
        tag = template_tag("firstuse", digest)
        with contextlib.suppress(NotFoundError):
            await client.call(lambda sdk: sdk.api.remove_image(tag))
    finally:
        await client.aclose()


async def test_an_mcp_call_that_builds_a_template_reports_it_as_progress(
    worker_image: ImageBuildResult, quick_template: tuple[Path, Path], removes_its_image: None
) -> None:
    templates, policy = quick_template
    settings = config(worker_image.tag, template_dirs=(templates,), policy_dirs=(policy.parent,))
    arguments = {"operation": "execute", "code": "1 + 1", "policy": "uses-firstuse"}
    heard: list[list[str]] = [[], []]
    calls = iter(heard)
    current: list[str] = []

    # The notice comes as the call's progress when the client sent a token, else as its log
    # (logger sandhold.build), as the protocol version the client and the SDK agree on allows.
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        current.append(message or "")

    async def on_log(params: Any) -> None:
        if params.logger == "sandhold.build":
            current.append(params.data["text"])

    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Orchestrator(settings) as orch:
            server = build_mcp_server(orch, tenant=lambda: "local")
            async with Client(server, logging_callback=on_log, log_level="info") as client:
                for _ in heard:
                    current = next(calls)
                    result = await client.call_tool(
                        "python_repl", arguments, progress_callback=on_progress
                    )
                    assert isinstance(result.structured_content, dict)
                    assert result.structured_content["result_repr"] == "2"
    first, second = heard
    assert first and first[0].startswith(f"{NOTICE} firstuse: about "), first
    assert "later sessions start at once" in first[0]
    assert any(line.startswith("template image") for line in first), first
    assert not any(NOTICE in line for line in second), second


async def test_sandhold_run_shows_the_build_before_the_answer(
    worker_image: ImageBuildResult, quick_template: tuple[Path, Path], removes_its_image: None
) -> None:
    templates, policy = quick_template
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")},
        "SANDHOLD_IMAGE": worker_image.tag,
        "SANDHOLD_TEMPLATES": str(templates),
        "SANDHOLD_POLICY": str(policy),
        "SANDHOLD_ORCHESTRATOR_ID": f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
        "SANDHOLD_DATA_DIR": str(templates.parent / "data"),
    }
    with anyio.fail_after(SCENARIO_TIMEOUT):
        done = await anyio.run_process(
            [sys.executable, "-m", "orchestrator.cli", "run", "--code", "print(6 * 7)"],
            env=env,
            check=False,
        )
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert done.stdout == b"42\n"
    lines = stderr.splitlines()
    [notice] = [index for index, line in enumerate(lines) if NOTICE in line]
    steps = [index for index, line in enumerate(lines) if line.startswith("template image")]
    assert steps and notice < steps[0], stderr


async def test_a_streamed_rest_create_sends_the_build_as_events_before_the_result(
    worker_image: ImageBuildResult, quick_template: tuple[Path, Path], removes_its_image: None
) -> None:
    """POST /v1/sessions with ``Accept: text/event-stream``: ``build`` events (the notice first,
    then the steps) come before the cell's ``stdout`` and its ``result``; the next create of
    that template streams no build."""
    templates, policy = quick_template
    settings = config(worker_image.tag, template_dirs=(templates,), policy_dirs=(policy.parent,))
    body = {"code": "print(6 * 7)", "policy": "uses-firstuse"}
    headers = {"Authorization": f"Bearer {KEY_A}", "Accept": "text/event-stream"}
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with (
            Orchestrator(settings) as orch,
            serving(build_app(orch, KEYS)) as url,
            httpx.AsyncClient(base_url=url, headers=headers, timeout=SCENARIO_TIMEOUT) as http,
        ):
            first = [e async for e in _events(http, body)]
            second = [e async for e in _events(http, body)]
    kinds = [name for name, _ in first]
    assert kinds[-1] == "result" and first[-1][1]["success"], first[-1]
    builds = [data for name, data in first if name == "build"]
    assert builds and builds[0]["step"].startswith(f"{NOTICE} firstuse: about "), builds[:2]
    assert kinds.index("build") < kinds.index("stdout") < kinds.index("result"), kinds
    assert not [name for name, _ in second if name == "build"], second


async def _events(http: httpx.AsyncClient, body: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
    async with http.stream("POST", "/v1/sessions", json=body) as response:
        assert response.status_code == 200
        name = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and name is not None:
                yield name, json.loads(line.removeprefix("data: "))
