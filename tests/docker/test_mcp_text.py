"""A model that sees only the text content can carry a session on: driven over ``sandhold mcp`` with
the official client, reading nothing but ``content[0].text``, it finds every id, the output, file
content and listings, and the error type and message; a large output goes out in full once."""

from __future__ import annotations

import re

import anyio
import pytest
from mcp import Client

from orchestrator.images import ImageBuildResult
from orchestrator.tools._text import MAX_BLOCK_CHARS
from tests.docker.test_mcp_stdio import SCENARIO_TIMEOUT, new_orchestrator_id, stdio_server

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

BIG_OUTPUT_CHARS = 60_000


class TextOnlyModel:
    """Calls tools and reads only the text of each answer, as a text-only client shows it."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, tool: str, **arguments: object) -> str:
        result = await self.client.call_tool(tool, arguments)
        block = result.content[0]
        assert block.type == "text"
        return block.text

    @staticmethod
    def field(text: str, name: str) -> str:
        found = re.search(rf"^{name}: (.+)$", text, re.MULTILINE)
        assert found, (name, text)
        return found.group(1)


async def test_a_text_only_model_finds_ids_output_files_and_errors_in_the_text(
    worker_image: ImageBuildResult,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            model = TextOnlyModel(client)
            first = await model.call("python_repl", operation="execute", code="x = 41")
            sid = model.field(first, "session_id")
            assert model.field(first, "created_new_session") == "true"
            second = await model.call(
                "python_repl", operation="execute", session_id=sid, code="x+1"
            )
            assert model.field(second, "result_repr") == "42"

            started = await model.call(
                "terminal", operation="start", session_id=sid, command="echo hi; sleep 60"
            )
            tid = model.field(started, "terminal_id")
            assert "hi" in started
            killed = await model.call("terminal", operation="kill", terminal_id=tid)
            assert model.field(killed, "terminal_id") == tid

            spawned = await model.call(
                "process", operation="start", session_id=sid, command="sleep 60"
            )
            pid = model.field(spawned, "process_id")
            listing = await model.call("process", operation="list", session_id=sid)
            assert f'"process_id":"{pid}"' in listing

            await model.call(
                "files", operation="write", session_id=sid, path="notes.txt", content="hello\n"
            )
            read = await model.call("files", operation="read", session_id=sid, path="notes.txt")
            assert model.field(read, "content") == "hello"
            entries = await model.call("files", operation="list", session_id=sid)
            assert '"name":"notes.txt"' in entries

            failed = await model.call(
                "python_repl", operation="execute", session_id=sid, code="1/0"
            )
            assert failed.startswith("python_repl.execute: ZeroDivisionError")
            assert model.field(failed, "error_message") == "division by zero"
            assert "Traceback" in failed

            sessions = await model.call("python_repl", operation="list_sessions")
            assert f'"session_id":"{sid}"' in sessions


async def test_a_large_output_goes_out_in_full_once(worker_image: ImageBuildResult) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(stdio_server(worker_image.tag, new_orchestrator_id())) as client:
            code = f"print('a' + 'x' * {BIG_OUTPUT_CHARS - 2} + 'z')"
            result = await client.call_tool("python_repl", {"operation": "execute", "code": code})
            assert isinstance(result.structured_content, dict)
            stdout = result.structured_content["stdout"]
            assert len(stdout) == BIG_OUTPUT_CHARS + 1  # with print's newline
            text = result.content[0].text  # type: ignore[union-attr]
            assert len(text) < MAX_BLOCK_CHARS + 1000
            assert "\nax" in text and "xz" in text and "left out here" in text
            assert (
                TextOnlyModel.field(text, "session_id") == result.structured_content["session_id"]
            )
