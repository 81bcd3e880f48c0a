"""The text content of a result: a compact, faithful rendering of its structured content, for
clients that show a model only the text (langchain-mcp-adapters, openai-agents, mcp-use and
smolagents do by default). A model reading it alone can carry on: it holds every id, every
scalar field, listings, the output, file content, and the error type and message.

The layout, one item per line::

    python_repl.execute: ok                  <tool>.<operation>: ok, or the error_type
    error_message: ...                       on failure
    session_id: 3f…                          ids first, then the other scalar fields in order
    created_new_session: true                (fields that are null, empty or absent are left out)
    sessions:                                a listing: one compact JSON object per line
    {"session_id":"3f…","policy":"default"}
    stdout:                                  text fields last, as they are
    43

Large output goes out once in full (the rule is in docs/tool-contract.md): the structured content
always carries every field whole, and a text block longer than ``MAX_BLOCK_CHARS`` keeps its
start and end, with a line saying how much was left out and where to find it. Base64 fields
(``content_b64``, ``tar_b64``) are named with their size, not repeated.
"""

from __future__ import annotations

import json
from typing import Any

# About 2,000 tokens per block: the output a model acts on fits whole; a 100 KB print does not
# go out twice, and a model's context is not spent on the middle of it.
MAX_BLOCK_CHARS = 8192
# A scalar string longer than this, or holding a newline, is shown as a block.
MAX_INLINE_CHARS = 200
# Text fields, shown last and in this order; any other multi-line string follows them.
TEXT_FIELDS = ("stdout", "stderr", "output", "result_repr", "content", "context", "traceback")
BASE64_FIELDS = frozenset({"content_b64", "tar_b64"})
# Rich results: each is shown by its text/plain, with the other types it holds named and sized
# (a PNG is not text; MCP carries images as image content beside the text).
RESULTS_FIELD = "results"
_HEAD_FIELDS = frozenset({"success", "operation", "error_type", "error_message"})


def render_text(tool: str, structured: dict[str, Any]) -> str:
    """The text content of ``structured``, the result of one call of ``tool``."""
    outcome = "ok" if structured.get("success") else str(structured.get("error_type"))
    lines = [f"{tool}.{structured.get('operation')}: {outcome}"]
    message = structured.get("error_message")
    if message:
        lines += _field("error_message", str(message))
    blocks: dict[str, str] = {}
    listings: list[str] = []
    for name in sorted(structured, key=lambda key: not key.endswith("_id")):
        value = structured[name]
        if name in _HEAD_FIELDS or value is None or value in ("", [], {}):
            continue
        if name == RESULTS_FIELD and isinstance(value, list):
            listings += _field(name, "\n".join(_result_line(row) for row in value))
        elif name in BASE64_FIELDS and isinstance(value, str):
            lines.append(f"{name}: {len(value)} base64 characters (in the structured content)")
        elif isinstance(value, str) and (name in TEXT_FIELDS or _is_long(value)):
            blocks[name] = value
        elif isinstance(value, list | dict) and _is_listing(value):
            listings += _field(name, "\n".join(_compact(row) for row in value))
        else:
            lines.append(f"{name}: {_scalar(value)}")
    lines += listings
    for name in sorted(blocks, key=_block_order):
        lines += _field(name, blocks[name])
    return "\n".join(lines)


def bounded(text: str, name: str, limit: int = MAX_BLOCK_CHARS) -> str:
    """``text`` whole when it fits ``limit``, else its start and end around a line that says
    how much was left out here (the structured content's ``name`` has all of it)."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    omitted = len(text) - 2 * keep
    note = f"\n[… {omitted} characters left out here; the structured content's `{name}` has all]\n"
    return text[:keep] + note + text[-keep:]


def _field(name: str, value: str) -> list[str]:
    value = value.removesuffix("\n")  # a last newline is the line's end, not more text
    if not _is_long(value):
        return [f"{name}: {value}"]
    return [f"{name}:", bounded(value, name)]


def _result_line(bundle: Any) -> str:
    if not isinstance(bundle, dict):
        return _compact(bundle)
    text = str(bundle.get("text/plain", ""))
    others = [
        f"{mime} ({len(data) if isinstance(data, str) else len(_compact(data))} chars)"
        for mime, data in bundle.items()
        if "/" in mime and mime != "text/plain"
    ]
    flags = [flag for flag in ("is_main_result", "truncated") if bundle.get(flag)]
    extra = f" [{', '.join(others + flags)}]" if others or flags else ""
    return bounded(text, "results", MAX_INLINE_CHARS * 4) + extra


def _is_long(value: str) -> bool:
    return "\n" in value or len(value) > MAX_INLINE_CHARS


def _is_listing(value: list[Any] | dict[str, Any]) -> bool:
    return isinstance(value, list) and all(isinstance(row, dict) for row in value)


def _block_order(name: str) -> tuple[int, str]:
    return (TEXT_FIELDS.index(name) if name in TEXT_FIELDS else len(TEXT_FIELDS), name)


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return bounded(_compact(value), "")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
