"""Reading an egress proxy's log and totals: JSON from a container, so untrusted. Each log line
must be an object of exactly the known fields with the right types and bounded sizes; anything
else is dropped, and at most ``MAX_ENTRIES`` of the newest are kept. The totals must be one object
of two counts and at most ``MAX_RULES`` refusal counts; anything else reads as None."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_ENTRIES", "EgressCounters", "parse_counters", "parse_log"]

# The proxy keeps a ring of this many; a longer answer is not one it wrote.
MAX_ENTRIES = 512
MAX_TEXT = 300
# The proxy refuses for a dozen reasons; more distinct rules than this is not its file.
MAX_RULES = 32
MAX_RULE_TEXT = 64
# A proxy lives as long as its session; no session moves an exabyte.
MAX_COUNT = 1 << 60
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


@dataclass(frozen=True)
class EgressCounters:
    """A proxy's totals since it started: bytes from the session (sent) and to it (received),
    and its refused attempts by rule."""

    bytes_sent: int = 0
    bytes_received: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def parse_counters(data: bytes) -> EgressCounters | None:
    """The totals in ``data`` (the proxy's stats file), or None when they are not ones it wrote;
    an empty file (no totals written yet) is all zeros."""
    if not data.strip():
        return EgressCounters()
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    if not isinstance(raw, dict) or set(raw) != {"bytes_sent", "bytes_received", "refused"}:
        return None
    refused = raw["refused"]
    if not _count(raw["bytes_sent"]) or not _count(raw["bytes_received"]):
        return None
    if not isinstance(refused, dict) or len(refused) > MAX_RULES:
        return None
    if not all(len(rule) <= MAX_RULE_TEXT and _count(n) for rule, n in refused.items()):
        return None
    return EgressCounters(raw["bytes_sent"], raw["bytes_received"], dict(refused))
