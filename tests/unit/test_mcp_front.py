"""``sandhold mcp --connect`` is a process a client may start per call, so it must start light
(issue 32): run as the console script, it imports neither the MCP SDK nor typer, rich, anyio,
httpx2 or pydantic, and still answers the handshake and a call. The server here is a loopback
port nobody listens on, so the call answers ``backend_unavailable``. Also: which argument lists
take the light way in, and which are left to typer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.text import TextReceiveStream

from orchestrator.cli._front import FrontOptions, front_options
from tests.unit.test_cli_imports import DRIVER, heavy_in

# Never imported by the front: the SDK (its import alone cost ~0.7 s a call), the command-line
# framework, the event loop, the HTTP clients and models of the rest of sandhold.
NOT_IN_THE_FRONT = (
    "mcp",
    "mcp_types",
    "typer",
    "rich",
    "anyio",
    "httpx",
    "httpx2",
    "pydantic",
    "orchestrator.tools",
    "orchestrator.mcp_server.server",
)
# A process that answers two lines and exits at EOF: generous for a loaded machine.
FRONT_TIMEOUT = 60


def refused_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def lines(*messages: dict[str, object]) -> bytes:
    return b"".join(json.dumps(message).encode() + b"\n" for message in messages)


@pytest.mark.anyio
async def test_the_front_answers_without_importing_the_sdk_or_typer(tmp_path: Path) -> None:
    out = tmp_path / "modules.json"
    initialize = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    }
    call = {"name": "python_repl", "arguments": {"operation": "list_sessions"}}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")},
        "SANDHOLD_API_KEY": "sandhold_test-key",
        "SANDHOLD_DATA_DIR": str(tmp_path / "data"),
    }
    argv = [sys.executable, "-c", DRIVER, str(out), "mcp", "--connect", refused_url()]
    answers: dict[int, dict[str, Any]] = {}
    with anyio.fail_after(FRONT_TIMEOUT):
        async with await anyio.open_process(argv, env=env, stderr=subprocess.DEVNULL) as front:
            assert front.stdin is not None and front.stdout is not None
            await front.stdin.send(
                lines(
                    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "ping"},
                    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call},
                )
            )
            buffered = ""
            async for chunk in TextReceiveStream(front.stdout):
                *complete, buffered = (buffered + chunk).split("\n")
                for frame in map(json.loads, complete):
                    answers[frame["id"]] = frame
                if len(answers) == 3:
                    break
            await front.stdin.aclose()  # EOF: the front ends
            assert await front.wait() == 0
    modules = set(json.loads(out.read_text()))
    assert "orchestrator.mcp_server.forward" in modules  # the front ran
    assert heavy_in(modules, NOT_IN_THE_FRONT) == []
    assert answers[1]["result"]["serverInfo"]["name"] == "sandhold"
    assert answers[2]["result"] == {}
    result = answers[3]["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error_type"] == "backend_unavailable"
    assert result["content"][0]["text"].startswith("python_repl.list_sessions: backend_unavailable")


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["mcp", "--connect", "http://h:1"], {}, FrontOptions("http://h:1", None, None)),
        (
            ["mcp", "--connect=http://h:1", "--key", "k", "--task=t"],
            {},
            FrontOptions("http://h:1", "k", "t"),
        ),
        (
            ["mcp"],
            {"SANDHOLD_CONNECT": "http://h:1", "SANDHOLD_API_KEY": "k"},
            FrontOptions("http://h:1", "k", None),
        ),
        (
            ["mcp", "--key", "k"],
            {"SANDHOLD_CONNECT": "http://e:1"},
            FrontOptions("http://e:1", "k", None),
        ),
        (["mcp"], {}, None),  # the local server: typer's
        (["mcp", "--connect", "http://h:1"], {"SANDHOLD_TOOLS": "agent"}, None),  # refused there
        (
            ["mcp", "--connect", "http://h:1"],
            {"SANDHOLD_TOOLS": "all"},
            FrontOptions("http://h:1", None, None),
        ),
        (["mcp", "--connect", "http://h:1", "--policy", "strict"], {}, None),  # typer refuses it
        (["mcp", "--connect", "http://h:1", "--help"], {}, None),
        (["mcp", "--connect"], {}, None),
        (["mcp", "--connect", "http://h:1", "--connect", "http://g:1"], {}, None),
        (["run", "--connect", "http://h:1"], {}, None),
        ([], {"SANDHOLD_CONNECT": "http://h:1"}, None),
    ],
)
def test_only_mcp_with_the_fronts_own_options_takes_the_light_way_in(
    argv: list[str], environ: dict[str, str], expected: FrontOptions | None
) -> None:
    assert front_options(argv, environ) == expected
