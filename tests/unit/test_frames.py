"""Numbers in what a container sends are bounded before anything uses them: a frame holding a
number out of bounds is a protocol violation, never an uncaught error or a non-finite float."""

from __future__ import annotations

import pytest

from orchestrator.session.repl.protocol import (
    MAX_INT_DIGITS,
    ProtocolViolation,
    decode_frame,
    untrusted_json,
)

REPLY = '{"type": "reply", "id": "r1", "ok": true, "n": %s}'


@pytest.mark.parametrize(
    "number",
    [
        "9" * 5000,
        "-" + "9" * 5000,
        "9" * (MAX_INT_DIGITS + 1),
        "Infinity",
        "-Infinity",
        "NaN",
        "1e999",
    ],
)
def test_a_frame_with_a_number_out_of_bounds_is_a_protocol_violation(number: str) -> None:
    with pytest.raises(ProtocolViolation):
        decode_frame((REPLY % number).encode())


@pytest.mark.parametrize("line", [b"[" * 100_000, b"\xff\xfe", b'{"a": 1} trailing', b"not json"])
def test_what_is_not_strict_json_is_a_protocol_violation(line: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        decode_frame(line)


def test_numbers_within_bounds_parse_as_themselves() -> None:
    largest = int("9" * MAX_INT_DIGITS)
    assert untrusted_json(f"[{largest}, -{largest}, 1.5e300, 0]") == [largest, -largest, 1.5e300, 0]
