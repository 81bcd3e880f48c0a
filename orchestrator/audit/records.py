"""The audit log's record format: canonical JSON lines, their hashes and the segment names.

A log is a directory of numbered segments, ``audit-000001.jsonl``, ``audit-000002.jsonl``, ...
Each segment opens with a ``segment`` record; each tool call adds a ``call`` record. A record's
``hash`` is the sha256 of all its other fields (``prev`` among them) as canonical JSON (sorted
keys, no spaces, ASCII); ``prev`` is the ``hash`` of the record before it, across segments, and
``GENESIS_HASH`` for the first; ``seq`` counts records from 0 without a gap. Arguments are kept
as the sha256 of their canonical JSON, in clear only with ``AuditConfig.record_arguments``; the
values of environment arguments (``env``, ``session_env``) are never kept, not even hashed (a
hash of a short secret is a guess away from it): a record holds their names, each with ``***``.

A call record states what the host observed apart from what the sandbox said (``call_outcome``):
``success`` and ``error_type`` are the host's own outcome (it refused the call, timed it out, saw
the worker die, or the call completed), ``ran`` whether the call went ahead at all,
``duration_ms`` the host's clock, ``exit_status`` an exit status the engine reported; what a
worker or helper reported (a cell's success and error type, its timings, a shell's status) goes
under ``worker_claims``, since anything in the container can forge it.

Invariants:
- Pure: no state, and no I/O but listing a directory (``segment_files``); the writer
  (``orchestrator.audit_writer``) and the verifier (``orchestrator.audit_verify``) share it, so
  what one writes is exactly what the other checks.
- A line is the record's fields in their given order with ``hash`` last, as compact ASCII JSON;
  ``decode_record`` accepts a line only in that form, so a rewritten line is caught even when
  its hash still matches.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import ERROR_TYPES
from orchestrator.session.repl.protocol import WORKER_ERROR_TYPES

__all__ = [
    "FORMAT_VERSION",
    "GENESIS_HASH",
    "SEGMENT_NAME",
    "TornTail",
    "arguments_digest",
    "call_outcome",
    "canonical_arguments",
    "content_hash",
    "decode_record",
    "encode_record",
    "redacted_arguments",
    "segment_files",
    "segment_name",
]

GENESIS_HASH: Final = "0" * 64
# Arguments that carry environment variables, whose values may be secrets.
ENV_ARGUMENTS: Final = frozenset({"env", "session_env"})
REDACTED: Final = "***"
FORMAT_VERSION: Final = 1
SEGMENT_NAME: Final = re.compile(r"audit-(\d{6,})\.jsonl")

# Error types only the host gives (the protocol refuses a worker reply naming one): an answer
# carrying one is the host's outcome, never a worker's claim. ``cancelled`` is the audit's own.
HOST_ERROR_TYPES: Final = frozenset(ERROR_TYPES) - WORKER_ERROR_TYPES | {"cancelled"}
# Refusals: the call did not go ahead (a helper's own refusal of a path is counted here too).
REFUSED_ERROR_TYPES: Final = frozenset(
    {"invalid_argument", "session_not_found", "policy", "quota_exceeded", "busy", "not_supported"}
)
# The fields of a completed answer that came from the sandbox, by tool and operation.
CLAIMED_FIELDS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    ("python_repl", "execute"): (
        "success",
        "error_type",
        "execution_time_ms",
        "cpu_time_ms",
        "peak_memory_mb",
        "truncated",
    ),
    ("terminal", "run"): ("exit_code",),  # the shell's status line
    ("process", "start"): ("pid",),
    ("process", "read_output"): ("state", "exit_code"),
    ("process", "kill"): ("state", "exit_code", "signal_used", "group_empty"),
    ("files", "write"): ("size", "created"),
    ("files", "remove"): ("type",),
    ("files", "rename"): ("replaced",),
    ("files", "make_dir"): ("created",),
}
# Operations whose ``exit_code`` the host read from the engine (the exec's own exit status).
ENGINE_EXIT_STATUS: Final = frozenset(
    {("terminal", "read"), ("terminal", "wait"), ("terminal", "kill"), ("terminal", "interrupt")}
)


@dataclass(frozen=True)
class TornTail:
    """A partial last line of a segment: the bytes a crash left after its last complete line."""

    segment: str
    line: int
    offset: int
    length: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "line": self.line,
            "offset": self.offset,
            "length": self.length,
            "sha256": self.sha256,
        }


def arguments_digest(arguments: Any) -> str:
    """The sha256 of ``arguments`` as a record keeps them (canonical JSON, env values
    redacted): equal arguments, equal digests."""
    return hashlib.sha256(canonical_arguments(redacted_arguments(arguments)).encode()).hexdigest()


def call_outcome(tool: str, structured: Mapping[str, Any], *, answered: bool) -> dict[str, Any]:
    """A call record's outcome fields from the answer the caller got (``answered`` False: it got
    none, it was cancelled): ``success``, ``error_type``, ``ran``, and where there are any
    ``exit_status`` and ``worker_claims``."""
    error_type = structured.get("error_type")
    key = (tool, str(structured.get("operation")))
    claims: dict[str, Any] = {}
    host_error = not structured.get("success") and error_type in HOST_ERROR_TYPES
    if answered and not host_error:
        claims = {
            name: structured[name] for name in CLAIMED_FIELDS.get(key, ()) if name in structured
        }
    fields: dict[str, Any] = {
        "success": bool(structured.get("success")) or (answered and not host_error),
        "error_type": error_type if host_error or not answered else None,
        "ran": error_type not in REFUSED_ERROR_TYPES,
    }
    if key in ENGINE_EXIT_STATUS and type(structured.get("exit_code")) is int:
        fields["exit_status"] = structured["exit_code"]
    if claims:
        fields["worker_claims"] = claims
    return fields


def segment_name(number: int) -> str:
    return f"audit-{number:06d}.jsonl"


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """The segments in ``directory`` as ``(number, path)``, in order; other files are ignored."""
    found = [(SEGMENT_NAME.fullmatch(p.name), p) for p in directory.iterdir() if p.is_file()]
    return sorted((int(match[1]), path) for match, path in found if match)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def canonical_arguments(arguments: Any) -> str:
    """``arguments`` as canonical JSON, or their ``repr`` as a JSON string if they have none."""
    try:
        return _canonical(arguments)
    except (TypeError, ValueError):  # keys of mixed types, or a circular structure
        return json.dumps(repr(arguments))


def redacted_arguments(arguments: Any) -> Any:
    """``arguments`` with the value of every environment argument replaced by ``***``: a map (or
    a list of ``{name, value}`` pairs) keeps its names, anything else becomes ``***`` whole."""
    if not isinstance(arguments, Mapping) or not ENV_ARGUMENTS & set(arguments):
        return arguments
    return {
        key: _redacted_env(value) if key in ENV_ARGUMENTS else value
        for key, value in arguments.items()
    }


def _redacted_env(env: Any) -> Any:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return {str(name): REDACTED for name in env}
    if isinstance(env, list):
        return [
            {"name": str(p["name"]), "value": REDACTED}
            if isinstance(p, Mapping) and isinstance(p.get("name"), str)
            else REDACTED
            for p in env
        ]
    return REDACTED


def _digest(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical(fields).encode()).hexdigest()


def encode_record(fields: dict[str, Any]) -> tuple[bytes, str]:
    """One line (fields in their given order, ``hash`` last) and its hash."""
    digest = _digest(fields)
    text = json.dumps({**fields, "hash": digest}, separators=(",", ":"), ensure_ascii=True)
    return (text + "\n").encode(), digest


def decode_record(raw: bytes) -> dict[str, Any]:
    """The record on one line (without its newline), or ValueError saying what is wrong."""
    text = raw.decode("ascii")
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if json.dumps(record, separators=(",", ":"), ensure_ascii=True) != text:
        raise ValueError("not in canonical form (the line was rewritten)")
    seq, prev, digest = record.get("seq"), record.get("prev"), record.get("hash")
    if type(seq) is not int or not isinstance(prev, str) or not isinstance(digest, str):
        raise ValueError("seq, prev or hash is missing or of the wrong type")
    if next(reversed(record)) != "hash":
        raise ValueError("hash is not the last field")
    return record


def content_hash(record: Mapping[str, Any]) -> str:
    """What a decoded record's ``hash`` must be: the digest of all its other fields."""
    return _digest({key: value for key, value in record.items() if key != "hash"})
