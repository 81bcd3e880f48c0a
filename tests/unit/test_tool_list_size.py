"""What the tool list costs a model on every turn: ``tools/list`` as the official MCP SDK's client
receives it from sandhold's server (in-process, no engine), measured as the JSON it travels as.
The whole contract stays listed by default within ``DEFAULT_LIST_MAX_BYTES``; the agent set
(``--tools agent``, ``/mcp?tools=agent``) within ``AGENT_LIST_MAX_BYTES``. Figures in
bench/README.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client

from orchestrator.errors import InvalidArgumentError
from orchestrator.mcp_server.server import build_mcp_server, streamable_http_app
from orchestrator.tools import AGENT_TOOL_SET, DEFAULT_TOOL_SET, TOOLS, tool_set

pytestmark = pytest.mark.anyio

# Issue 32's targets: about 1,600 tokens a turn for the whole contract, 600 for the agent set
# (it was 19,471 bytes, ~3,900 tokens).
DEFAULT_LIST_MAX_BYTES = 8 * 1024
AGENT_LIST_MAX_BYTES = 3 * 1024
# A protocol version the stateless HTTP endpoint answers a bare tools/list for.
VERSION = "2025-06-18"
# An in-process listing takes milliseconds.
LIST_TIMEOUT = 10.0
# One CLI process: the interpreter's imports, then a refusal.
CLI_TIMEOUT = 60


class NoCalls:
    async def call(self, tool: Any, arguments: Any, **options: Any) -> Any:
        raise AssertionError("listing calls no tool")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def listed(tools: str) -> types.ListToolsResult:
    server = build_mcp_server(NoCalls(), tenant=lambda: "local", tools=tools)
    with anyio.fail_after(LIST_TIMEOUT):
        async with Client(server) as client:
            return await client.list_tools()


def wire_bytes(listing: types.ListToolsResult) -> int:
    return len(listing.model_dump_json(by_alias=True, exclude_none=True).encode())


async def test_the_default_list_holds_every_tool_and_operation_within_its_budget() -> None:
    listing = await listed(DEFAULT_TOOL_SET)
    size = wire_bytes(listing)
    assert size <= DEFAULT_LIST_MAX_BYTES, size
    schemas = {tool.name: tool.input_schema for tool in listing.tools}
    assert set(schemas) == set(TOOLS)
    for name, tool in TOOLS.items():
        assert schemas[name]["properties"]["operation"]["enum"] == list(tool.operations)
        arguments = {a for op in tool.operations.values() for a in op.args.model_fields}
        assert set(schemas[name]["properties"]) == {"operation", *arguments}


async def test_the_agent_list_is_execute_run_files_and_session_create_within_its_budget() -> None:
    listing = await listed(AGENT_TOOL_SET)
    size = wire_bytes(listing)
    assert size <= AGENT_LIST_MAX_BYTES, size
    operations = {
        tool.name: tool.input_schema["properties"]["operation"]["enum"] for tool in listing.tools
    }
    assert operations == {
        "python_repl": ["execute", "destroy"],
        "terminal": ["run"],
        "files": ["read", "write", "list"],
        "session": ["create"],
    }


def test_an_unknown_tool_set_is_refused_naming_the_sets() -> None:
    with pytest.raises(InvalidArgumentError, match="all, agent"):
        tool_set("everything")


def test_a_set_keeps_every_argument_its_operations_require() -> None:
    for name, tool in tool_set(AGENT_TOOL_SET).items():
        for operation in tool.operations.values():
            full = TOOLS[name].operations[operation.name].args.model_fields
            required = {n for n, f in full.items() if f.is_required()}
            assert required <= set(operation.args.model_fields), (name, operation.name)


async def test_the_http_endpoint_lists_the_set_its_query_names_and_refuses_an_unknown_one() -> None:
    app = streamable_http_app(NoCalls(), tenant=lambda: "local")
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": VERSION}
    async with (
        app.run(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8080"
        ) as http,
    ):
        with anyio.fail_after(LIST_TIMEOUT):
            unknown = await http.post("/mcp?tools=everything", json=request, headers=headers)
            agent = await http.post("/mcp?tools=agent", json=request, headers=headers)
    assert unknown.status_code == 400
    assert unknown.json()["error_type"] == "invalid_argument"
    assert agent.status_code == 200, agent.text
    # The answer comes as one server-sent event.
    [data] = [line for line in agent.text.splitlines() if line.startswith("data: ")]
    names = {tool["name"] for tool in json.loads(data.removeprefix("data: "))["result"]["tools"]}
    assert names == set(tool_set(AGENT_TOOL_SET))


@pytest.mark.parametrize(
    ("args", "variables", "message"),
    [
        (["--tools", "everything"], {}, "unknown tool set 'everything'; the sets are: all, agent"),
        ([], {"SANDHOLD_TOOLS": "everything"}, "unknown tool set 'everything'"),
        (["--connect", "http://127.0.0.1:9", "--tools", "agent"], {}, "does not apply with"),
        (["--connect", "http://127.0.0.1:9"], {"SANDHOLD_TOOLS": "agent"}, "does not apply with"),
    ],
)
def test_sandhold_mcp_refuses_a_tool_set_it_cannot_list(
    args: list[str], variables: dict[str, str], message: str
) -> None:
    """Before serving (no engine is needed to be refused): an unknown set, or a set with
    ``--connect``, whose list is the server's."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "mcp", *args],
        env={**os.environ, **variables},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert done.stdout == ""


async def test_hints_are_listed_only_where_they_differ_from_mcps_defaults() -> None:
    """MCP's defaults: not read-only, destructive, not idempotent, open world."""
    listing = await listed(DEFAULT_TOOL_SET)
    hints = {
        tool.name: tool.annotations.model_dump(exclude_none=True) if tool.annotations else None
        for tool in listing.tools
    }
    assert hints == {
        "python_repl": None,
        "terminal": None,
        "process": None,
        "files": {"idempotent_hint": True, "open_world_hint": False},
        "session": {"open_world_hint": False},
    }
