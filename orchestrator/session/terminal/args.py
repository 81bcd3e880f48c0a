"""Checks for the arguments of the terminal operations, and the limits they enforce.

Pure: no I/O. A bad argument is refused here with ``invalid_argument`` before anything starts or
changes; every check returns the value in the type the terminal code uses. The checks every tool
shares (a command, an id, an integer, a flag) are ``policy.commands``' and ``policy.arguments``'.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.arguments import check_int
from orchestrator.session.terminal.output_buffer import CHUNK_BYTES

__all__ = [
    "DEFAULT_WAIT_MS",
    "DEFAULT_YIELD_MS",
    "MAX_CURSOR",
    "MAX_TERMINAL_SIZE",
    "MAX_WAIT_MS",
    "MAX_YIELD_MS",
    "MIN_READ_BYTES",
    "ReadArgs",
    "input_bytes",
    "read_args",
    "shorten",
]

# docker exec alone costs ~60 ms; a second catches the first output of most commands.
DEFAULT_YIELD_MS = 1_000
MAX_YIELD_MS = 30_000
DEFAULT_WAIT_MS = 1_000
# One call should not hold a client longer than this; it can always wait again.
MAX_WAIT_MS = 60_000
DEFAULT_READ_BYTES = 64 * 1024
# A seq read returns whole chunks, so the smallest read must hold one.
MIN_READ_BYTES = CHUNK_BYTES
MAX_READ_BYTES = 4 * 1024 * 1024
MAX_OUTPUT_CHARS = 4_000_000
MAX_INPUT_BYTES = 1024 * 1024
MAX_TERMINAL_SIZE = 1_000
# Cursors are byte offsets and chunk numbers: far beyond any output a terminal keeps.
MAX_CURSOR = 2**62


@dataclass(frozen=True)
class ReadArgs:
    """A checked read request: at most one cursor, a byte budget, an optional character cap."""

    since_seq: int | None
    since_offset: int | None
    max_bytes: int
    max_output_chars: int | None


def input_bytes(value: object) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgumentError("input_text must be a string")
    data = _utf8(value, "input_text")
    if len(data) > MAX_INPUT_BYTES:
        raise InvalidArgumentError(f"input_text is larger than {MAX_INPUT_BYTES} bytes")
    return data


def read_args(
    since_seq: object, since_offset: object, max_bytes: object, max_output_chars: object
) -> ReadArgs:
    if since_seq is not None and since_offset is not None:
        raise InvalidArgumentError("give since_seq or since_offset, not both")
    return ReadArgs(
        since_seq=None if since_seq is None else check_int(since_seq, "since_seq", 0, MAX_CURSOR),
        since_offset=(
            None if since_offset is None else check_int(since_offset, "since_offset", 0, MAX_CURSOR)
        ),
        max_bytes=(
            DEFAULT_READ_BYTES
            if max_bytes is None
            else check_int(max_bytes, "max_bytes", MIN_READ_BYTES, MAX_READ_BYTES)
        ),
        max_output_chars=(
            None
            if max_output_chars is None
            else check_int(max_output_chars, "max_output_chars", 1, MAX_OUTPUT_CHARS)
        ),
    )


def shorten(text: str, limit: int | None) -> tuple[str, int]:
    """``text`` within ``limit`` characters, its middle replaced by a note; and how many
    characters were left out."""
    if limit is None or len(text) <= limit:
        return text, 0
    note = f"\n[... {len(text)} characters omitted ...]\n"
    if limit < 2 * len(note):
        return text[len(text) - limit :], len(text) - limit
    keep = limit - len(note)
    head, omitted = keep // 2, len(text) - keep
    return text[:head] + f"\n[... {omitted} characters omitted ...]\n" + text[
        head + omitted :
    ], omitted


def _utf8(value: str, name: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} is not valid Unicode text") from None
