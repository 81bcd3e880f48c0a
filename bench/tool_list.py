"""What the tool list costs a model on every turn: ``tools/list`` of each tool set, as the
official MCP SDK's client receives it from sandhold's server (in-process: listing needs no
engine), in bytes of JSON as it travels; prints JSON.

    .venv/bin/python bench/tool_list.py

Targets (issue 32): the whole contract (``all``) <= 8 KiB, the agent set (``--tools agent``,
``/mcp?tools=agent``) <= 3 KiB; tests/unit/test_tool_list_size.py holds both.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp import Client

from orchestrator.mcp_server.server import build_mcp_server
from orchestrator.tools import TOOL_SET_NAMES

TARGETS = {"all": 8 * 1024, "agent": 3 * 1024}
# Issue 32 counted ~3,900 tokens for the 19.5 KB list: about 5 bytes of this JSON a token.
BYTES_PER_TOKEN = 5


class NoCalls:
    async def call(self, tool: Any, arguments: Any, **options: Any) -> Any:
        raise AssertionError("listing calls no tool")


async def measure(tools: str) -> dict[str, Any]:
    server = build_mcp_server(NoCalls(), tenant=lambda: "local", tools=tools)
    async with Client(server) as client:
        listing = await client.list_tools()
    size = len(listing.model_dump_json(by_alias=True, exclude_none=True).encode())
    per_tool = {
        tool.name: len(tool.model_dump_json(by_alias=True, exclude_none=True).encode())
        for tool in listing.tools
    }
    return {
        "bytes": size,
        "approx_tokens": size // BYTES_PER_TOKEN,
        "target_bytes": TARGETS[tools],
        "meets_target": size <= TARGETS[tools],
        "per_tool_bytes": per_tool,
    }


async def main() -> None:
    print(json.dumps({name: await measure(name) for name in TOOL_SET_NAMES}, indent=2))


if __name__ == "__main__":
    anyio.run(main)
