"""Reading an egress proxy's log: JSON lines from a container, so untrusted. Each line must be an
object of exactly the known fields with the right types and bounded sizes; anything else is
dropped, and at most ``MAX_ENTRIES`` of the newest are kept."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_ENTRIES", "parse_log"]

# The proxy keeps a ring of this many; a longer answer is not one it wrote.
MAX_ENTRIES = 512
MAX_TEXT = 300
_INTS = ("seq", "port", "bytes_sent", "bytes_received")
_FLOATS = ("time", "duration_s")
_TEXTS = ("method", "host", "decision", "rule")


def _entry(line: bytes) -> dict[str, Any] | None:
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or set(raw) != {*_INTS, *_FLOATS, *_TEXTS}:
        return None
    for key in _INTS:
        if type(raw[key]) is not int or raw[key] < 0:
            return None
    for key in _FLOATS:
        if type(raw[key]) not in (int, float):
            return None
    for key in _TEXTS:
        if not isinstance(raw[key], str) or len(raw[key]) > MAX_TEXT:
            return None
    if raw["decision"] not in ("allow", "deny"):
        return None
    return raw


def parse_log(data: bytes) -> list[dict[str, Any]]:
    """The valid entries of ``data``, oldest first, the newest ``MAX_ENTRIES`` at most, each
    sequence number once (the file may hold a ring rewritten beside older lines)."""
    by_seq: dict[int, dict[str, Any]] = {}
    for line in data.splitlines()[-2 * MAX_ENTRIES :]:
        if (entry := _entry(line)) is not None:
            by_seq[entry["seq"]] = entry
    return [by_seq[seq] for seq in sorted(by_seq)][-MAX_ENTRIES:]
