"""The text content of a result renders every field of its structured content (pure logic)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.tools._text import MAX_BLOCK_CHARS, render_text

RESULTS: list[tuple[str, dict[str, Any]]] = [
    (
        "python_repl",
        {
            "success": True,
            "operation": "execute",
            "stdout": "43\n",
            "stderr": "",
            "result_repr": None,
            "execution_time_ms": 1.5,
            "timed_out": False,
            "violations": [],
            "session_id": "s1",
            "created_new_session": True,
        },
    ),
    (
        "terminal",
        {
            "success": True,
            "operation": "start",
            "session_id": "s1",
            "terminal_id": "t1",
            "output": "line 1\nline 2\n",
            "state": "running",
            "exit_code": None,
            "next_offset": 14,
        },
    ),
    (
        "files",
        {
            "success": True,
            "operation": "list",
            "session_id": "s1",
            "path": "/workspace",
            "entries": [{"name": "a.txt", "type": "file", "size": 3}],
            "truncated": False,
        },
    ),
    (
        "python_repl",
        {
            "success": False,
            "operation": "execute",
            "session_id": "s1",
            "error_type": "ZeroDivisionError",
            "error_message": "division by zero",
            "traceback": "Traceback (most recent call last):\nZeroDivisionError: division by zero",
        },
    ),
]


@pytest.mark.parametrize(("tool", "structured"), RESULTS)
def test_every_field_that_holds_something_is_in_the_text(
    tool: str, structured: dict[str, Any]
) -> None:
    text = render_text(tool, structured)
    outcome = "ok" if structured["success"] else structured["error_type"]
    assert text.splitlines()[0] == f"{tool}.{structured['operation']}: {outcome}"
    for name, value in structured.items():
        if name in ("success", "operation", "error_type") or value in (None, "", []):
            continue
        if isinstance(value, list):
            for row in value:
                assert json.dumps(row, separators=(",", ":")) in text, (name, text)
        elif isinstance(value, str):
            assert value.removesuffix("\n") in text, (name, text)
            assert f"\n{name}:" in text
        else:
            assert f"\n{name}: {json.dumps(value)}" in text, (name, text)


def test_ids_come_right_after_the_status() -> None:
    text = render_text("terminal", RESULTS[1][1])
    assert text.splitlines()[1:3] == ["session_id: s1", "terminal_id: t1"]


def test_a_long_block_keeps_its_start_and_end_and_says_where_the_rest_is() -> None:
    stdout = "a" + "x" * 100_000 + "z"
    text = render_text("python_repl", {"success": True, "operation": "execute", "stdout": stdout})
    assert len(text) < MAX_BLOCK_CHARS + 200
    assert "\nax" in text and text.endswith("xz")
    assert "the structured content's `stdout` has all" in text


def test_base64_is_named_with_its_size_not_repeated() -> None:
    data = "QUJD" * 1000
    text = render_text("files", {"success": True, "operation": "read", "content_b64": data})
    assert data not in text and "content_b64: 4000 base64 characters" in text
