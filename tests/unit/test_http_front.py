"""The front door's pure parts: every surface's status table against the error tree, the body
reader's decoding and nesting checks (gzip bombs stopped at the cap, codings not taken, JSON
depth counted across chunks and Connect envelopes), and the key headers it reads."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import anyio
import pytest

from orchestrator import errors
from orchestrator.errors import (
    BodyTooLargeError,
    InvalidArgumentError,
    OrchestratorError,
    UnsupportedEncodingError,
)
from orchestrator.http._auth import presented_key
from orchestrator.http._bodies import BodyLimits, BoundedBody, JsonDepth, check_head
from orchestrator.http._statuses import (
    CONNECT_CODES,
    E2B_STATUS,
    HTTP_ONLY_STATUS,
    REST_STATUS,
    status_for,
)
from orchestrator.tools import CALL_FAILURES

pytestmark = pytest.mark.anyio


def _tree() -> Iterator[type[OrchestratorError]]:
    pending: list[type[OrchestratorError]] = [OrchestratorError]
    while pending:
        cls = pending.pop()
        yield cls
        pending += cls.__subclasses__()


@pytest.mark.parametrize("cls", sorted(_tree(), key=lambda c: c.__name__))
def test_every_error_class_has_a_status_on_every_surface(cls: type[OrchestratorError]) -> None:
    if cls.code not in CALL_FAILURES:  # what the work did (process_crashed): REST's 200
        assert cls.code in errors.ERROR_TYPES
        return
    assert cls.code in REST_STATUS, cls
    assert cls.code in E2B_STATUS, cls
    assert cls.code in CONNECT_CODES, cls


def test_every_table_answers_exactly_the_failures_of_a_call() -> None:
    failures = CALL_FAILURES - {"unauthenticated"}
    assert set(REST_STATUS) == failures
    assert set(E2B_STATUS) >= failures | set(HTTP_ONLY_STATUS)
    assert set(CONNECT_CODES) >= failures | set(HTTP_ONLY_STATUS)
    assert set(errors.ERROR_TYPES) >= failures


def test_files_not_found_has_its_own_code_and_no_table_reads_text() -> None:
    error = errors.PathNotFoundError("/workspace/x: no such file or directory")
    assert error.code == "path_not_found"
    assert status_for(error, REST_STATUS) == status_for(error, E2B_STATUS) == 404
    assert status_for(InvalidArgumentError("no such file or directory"), E2B_STATUS) == 400
    assert status_for(BodyTooLargeError("x"), E2B_STATUS) == 413
    assert status_for(UnsupportedEncodingError("x"), REST_STATUS) == 415


def _scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
    return {"type": "http", "headers": list(headers)}


def test_the_head_is_refused_before_the_body_is_read() -> None:
    limits = BodyLimits(max_raw_bytes=10)
    with pytest.raises(BodyTooLargeError):
        check_head(_scope((b"content-length", b"11")), limits)
    for coding in (b"br", b"zstd", b"gzip, gzip, gzip", b"compress"):
        with pytest.raises(UnsupportedEncodingError):
            check_head(_scope((b"content-encoding", coding)), limits)
    with pytest.raises(UnsupportedEncodingError):
        check_head(_scope((b"connect-content-encoding", b"gzip")), limits)
    assert check_head(_scope((b"content-encoding", b"GZIP, identity")), limits) == ["gzip"]


async def _read(data: bytes, codings: list[str], limits: BodyLimits, **options: object) -> bytes:
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)] or [b""]
    messages = iter(
        {"type": "http.request", "body": c, "more_body": n < len(chunks) - 1}
        for n, c in enumerate(chunks)
    )

    async def receive() -> dict[str, object]:
        return next(messages)

    body = BoundedBody(receive, limits, codings, **options)  # type: ignore[arg-type]
    out = b""
    while True:
        message = await body.receive()
        out += message["body"]
        if not message["more_body"]:
            return out


async def test_a_gzip_bomb_is_stopped_at_the_decoded_cap_having_read_little() -> None:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(deflate.compress(bytes(1 << 20)) for _ in range(256)) + deflate.flush()
    limits = BodyLimits(max_raw_bytes=1 << 20, max_decoded_bytes=1 << 20)
    with anyio.fail_after(10), pytest.raises(BodyTooLargeError):
        await _read(bomb, ["gzip"], limits)


@pytest.mark.parametrize(("coding", "wbits"), [("gzip", 31), ("deflate", 15)])
async def test_a_body_within_the_caps_comes_out_decoded(coding: str, wbits: int) -> None:
    data = bytes(range(256)) * 512
    packed = zlib.compress(data, wbits=wbits)
    assert await _read(packed, [coding], BodyLimits()) == data
    assert await _read(packed + packed, ["gzip"], BodyLimits()) == data * 2 if wbits == 31 else True
    with pytest.raises(InvalidArgumentError):
        await _read(packed[:-8], [coding], BodyLimits())


async def test_json_nesting_is_counted_across_chunks_outside_strings_only() -> None:
    deep = b"[" * 65 + b"]" * 65
    with pytest.raises(InvalidArgumentError, match="nested"):
        await _read(deep, [], BodyLimits(), json=JsonDepth(64))
    quoted = b'{"a": "' + b"[" * 5000 + b'\\"[[[", "b": [[1]]}'
    assert await _read(quoted, [], BodyLimits(), json=JsonDepth(64)) == quoted
    message = b"[" * 65
    envelope = b"\x00" + len(message).to_bytes(4, "big") + message
    with pytest.raises(InvalidArgumentError, match="nested"):
        await _read(envelope, [], BodyLimits(), json=JsonDepth(64, enveloped=True))
    # A length byte that is a bracket ("{" is 123) is framing, not JSON.
    fine = b"[" + b" " * 121 + b"]"
    framed = b"\x00" + len(fine).to_bytes(4, "big") + fine
    assert framed[4] == ord("{")
    assert await _read(framed * 70, [], BodyLimits(), json=JsonDepth(64, enveloped=True))


def test_the_key_is_e2bs_header_or_a_bearer() -> None:
    key = "k" * 40
    assert presented_key(_scope((b"authorization", f"Bearer {key}".encode()))) == key
    assert presented_key(_scope((b"x-api-key", key.encode()))) == key
    assert presented_key(_scope((b"authorization", b"Basic abc"))) is None
    assert presented_key(_scope()) is None
