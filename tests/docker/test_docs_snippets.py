"""Every MCP client snippet of docs/mcp-clients.md starts a working server exactly as it says.

Each snippet is read out of the page (the fenced block after its ``<!-- snippet: NAME -->``
marker): the server entry of a JSON configuration, or the dict literal with ``command`` in a
Python one. Its ``command``, ``args`` and ``env`` (or ``url`` and ``headers``) are used as
written, with two substitutions: the placeholder address and key are replaced by those of a
``sandhold serve`` started for the test, and the test's own settings (image, orchestrator id,
labels, data directory) are added to the environment so that every container is found and
removed. ``sandhold`` is looked up on a PATH that starts with this environment's scripts, as a
user's PATH would find the installed command. The official SDK's client then lists the tools
and runs one ``execute``."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from orchestrator.images import ImageBuildResult
from orchestrator.tools import AGENT_TOOL_SET, DEFAULT_TOOL_SET, tool_set
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.docker.test_mcp_stdio import SCENARIO_TIMEOUT, containers_of, new_orchestrator_id, ok
from tests.docker.test_serve import STOP_TIMEOUT, Server, running

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "mcp-clients.md"
SNIPPET = re.compile(r"<!-- snippet: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.S)
# What the page writes where a reader puts their own server's address and key.
ADDRESS = "http://127.0.0.1:8080"
KEY = "sandhold_..."
EXPECTED = {
    "claude-desktop",
    "claude-desktop-remote",
    "cursor",
    "vscode",
    "openai-agents",
    "langchain-mcp-adapters",
    "cursor-http",
    "agent-tools",
    "agent-tools-http",
}
HTTP_TIMEOUT = 60.0


def snippets() -> dict[str, dict[str, Any]]:
    """Each snippet's server entry, by name."""
    found = {}
    for name, language, code in SNIPPET.findall(PAGE.read_text(encoding="utf-8")):
        found[name] = _entry(language, code)
    return found


def _entry(language: str, code: str) -> dict[str, Any]:
    if language == "json":
        document = json.loads(code)
        servers = document.get("mcpServers") or document["servers"]
        (entry,) = servers.values()
        return dict(entry)
    assert language == "python", language
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "command" for k in node.keys
        ):
            return dict(ast.literal_eval(node))
    raise AssertionError("no dict with a command in the snippet")


def test_the_page_has_every_snippet_this_test_starts() -> None:
    assert set(snippets()) == EXPECTED


def _substituted(value: Any, server: Server | None) -> Any:
    if isinstance(value, str):
        if server is None:
            assert ADDRESS not in value and KEY not in value, value
            return value
        return value.replace(ADDRESS, server.url).replace(KEY, _key(server))
    if isinstance(value, list):
        return [_substituted(v, server) for v in value]
    if isinstance(value, dict):
        return {k: _substituted(v, server) for k, v in value.items()}
    return value


def _key(server: Server) -> str:
    """The key a fresh ``sandhold serve`` printed for its local tenant."""
    return server.notice.rsplit(": ", 1)[1]


def _needs_server(entry: dict[str, Any]) -> bool:
    text = json.dumps(entry)
    return ADDRESS in text or KEY in text


def _environment(image: str, orchestrator_id: str, data_dir: Path) -> dict[str, str]:
    scripts = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")]),
        "SANDHOLD_IMAGE": image,
        "SANDHOLD_ORCHESTRATOR_ID": orchestrator_id,
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
        "SANDHOLD_DATA_DIR": str(data_dir),
    }


@contextlib.asynccontextmanager
async def _server_if_needed(
    entry: dict[str, Any], image: str, tmp_path: Path
) -> AsyncIterator[Server | None]:
    if not _needs_server(entry):
        yield None
        return
    async with running(image, tmp_path) as server:
        try:
            yield server
        finally:
            server.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(STOP_TIMEOUT):
                await server.process.wait()


def _client(entry: dict[str, Any], env: dict[str, str], stack: contextlib.AsyncExitStack) -> Any:
    if "url" in entry:
        http = httpx2.AsyncClient(headers=entry.get("headers", {}), timeout=HTTP_TIMEOUT)
        stack.push_async_callback(http.aclose)
        return Client(streamable_http_client(entry["url"], http_client=http))
    command = shutil.which(entry["command"], path=env["PATH"])
    assert command is not None, f"{entry['command']} is not on the PATH"
    params = StdioServerParameters(
        command=command, args=entry.get("args", []), env={**env, **entry.get("env", {})}
    )
    return Client(params)


def _tool_set_of(entry: dict[str, Any]) -> str:
    """The tool set a snippet asks for: ``--tools NAME`` or ``?tools=NAME``."""
    args = entry.get("args", [])
    if "--tools" in args or f"tools={AGENT_TOOL_SET}" in entry.get("url", ""):
        return AGENT_TOOL_SET
    return DEFAULT_TOOL_SET


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_the_snippet_starts_a_server_that_lists_the_tools_and_executes(
    name: str, worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    written = snippets()[name]
    orchestrator_id = new_orchestrator_id()
    env = _environment(worker_image.tag, orchestrator_id, tmp_path / "client-data")
    async with _server_if_needed(written, worker_image.tag, tmp_path) as server:
        entry = _substituted(written, server)
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(_client(entry, env, stack))
                listed = {tool.name for tool in (await client.list_tools()).tools}
                assert listed == set(tool_set(_tool_set_of(entry)))
                done = await ok(client, "python_repl", operation="execute", code="6 * 7")
                assert done["result_repr"] == "42"
                args = entry.get("args", [])
                if "--policy" in args:
                    sessions = await ok(client, "python_repl", operation="list_sessions")
                    policy = args[args.index("--policy") + 1]
                    assert [s["policy"] for s in sessions["sessions"]] == [policy]
    assert containers_of(orchestrator_id) == []
    if server is not None:
        assert containers_of(server.orchestrator_id) == []
