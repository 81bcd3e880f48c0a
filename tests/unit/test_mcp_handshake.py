"""The ``initialize`` answer ``sandhold mcp`` gives before importing the MCP SDK is the SDK's own:
for every version it answers early, the server of ``sandhold mcp`` gives the SDK the same request
and gets back exactly the same frame (the ``--connect`` front imports no SDK: its answer is this
one, and any other version it forwards to the server's own SDK). Any other first frame is left to
the SDK. In-process, with the SDK's server on memory streams (no engine needed)."""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.server import Server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from orchestrator.mcp_server.handshake import (
    EARLY_VERSIONS,
    answer_initialize_early,
    initialize_reply,
    server_version,
)
from orchestrator.mcp_server.server import build_mcp_server

# The SDK answers an initialize at once; this bounds the in-process exchange.
EXCHANGE_TIMEOUT = 10.0


class NoCalls:
    async def call(self, tool: Any, arguments: Any, *, tenant: Any = None, task: Any = None) -> Any:
        raise AssertionError("initialize calls no tool")


def servers() -> dict[str, Server[Any]]:
    return {
        "mcp": build_mcp_server(NoCalls(), tenant=lambda: "local"),
    }


def initialize_line(version: str, request_id: int | str = 7) -> bytes:
    params = {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    }
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}
    ).encode()


async def sdk_answer(server: Server[Any], line: bytes) -> dict[str, Any]:
    """The frame the SDK's server writes for ``line``, as its stdio transport serialises it."""
    to_server, server_reads = create_context_streams[SessionMessage | Exception](1)
    server_writes, from_server = create_context_streams[SessionMessage](1)
    async with anyio.create_task_group() as group:
        group.start_soon(
            server.run, server_reads, server_writes, server.create_initialization_options()
        )
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        with anyio.fail_after(EXCHANGE_TIMEOUT):
            await to_server.send(SessionMessage(message))
            answer = await from_server.receive()
        group.cancel_scope.cancel()
    return dict(json.loads(answer.message.model_dump_json(by_alias=True, exclude_unset=True)))


def test_every_early_version_is_one_the_sdk_negotiates_by_handshake() -> None:
    assert EARLY_VERSIONS.issubset(HANDSHAKE_PROTOCOL_VERSIONS)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["mcp"])
@pytest.mark.parametrize("version", sorted(EARLY_VERSIONS))
@pytest.mark.parametrize("request_id", [7, "req-1"])
async def test_the_early_answer_is_the_sdks_answer(
    kind: str, version: str, request_id: int | str
) -> None:
    line = initialize_line(version, request_id)
    early = initialize_reply(line, version=server_version())
    assert early is not None and early[0] == request_id
    assert json.loads(early[1]) == await sdk_answer(servers()[kind], line)


@pytest.mark.parametrize(
    "line",
    [
        initialize_line("2026-07-28"),
        initialize_line("1999-01-01"),
        initialize_line("2025-06-18", request_id=True),  # type: ignore[arg-type]
        b'{"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}',
        b'{"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}',
        b"[" + initialize_line("2025-06-18") + b"]",
        b"not json",
        b"",
    ],
)
def test_any_other_first_frame_is_left_to_the_sdk(line: bytes) -> None:
    assert initialize_reply(line, version="1") is None


def test_the_early_step_answers_on_stdout_and_hands_on_what_it_read() -> None:
    line = initialize_line("2025-06-18") + b"\n"
    rest = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    try:
        os.write(write_in, line + rest)
        early = answer_initialize_early(fd_in=read_in, fd_out=write_out)
        assert early.consumed == line + rest and early.request_id == 7
        answer = json.loads(os.read(read_out, 1 << 16))
        assert answer["id"] == 7 and answer["result"]["protocolVersion"] == "2025-06-18"
    finally:
        for fd in (read_in, write_in, read_out, write_out):
            os.close(fd)
