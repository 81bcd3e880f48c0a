"""The one bounded reader of request bodies, for every HTTP surface (``_front`` puts it between
the server and each app): an ASGI ``receive`` that hands the app the body decoded and checked as
it comes, so that no app ever holds more than the caps, whatever it does with the body next
(parse it, base64 it, copy it into a tool call).

Per request, in this order and before the app sees a byte:
- the raw size: a ``Content-Length`` over ``max_raw_bytes`` is refused at once, a body that
  grows past it as it comes is refused there (``BodyTooLargeError``, 413);
- the encoding: ``Content-Encoding`` ``gzip``, ``x-gzip``, ``deflate`` (zlib) or ``identity``,
  at most ``MAX_CODINGS`` of them, is decoded as a stream, each step producing at most
  ``DECODE_STEP_BYTES`` and the whole stopped at ``max_decoded_bytes`` (413): a gzip bomb
  costs the server what it reads up to the cap, never its whole expansion. Any other coding,
  and any message-level coding of Connect or gRPC (``connect-content-encoding``,
  ``grpc-encoding``) other than identity, is ``UnsupportedEncodingError`` (415);
- JSON nesting, where the surface says the body is JSON: counted as the bytes pass (brackets
  outside strings; Connect's 5-byte envelopes skipped), refused past ``max_json_depth`` (400)
  before any parser recurses into it.

The app sees a body without ``Content-Encoding`` (the header is taken off the scope, and
``Content-Length`` with it once the body is decoded). An error raised from ``receive`` is kept
in ``BoundedBody.refused``: ``_front`` answers it in the surface's shape, whatever the app did
with the exception.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Callable
from typing import Final

import anyio.lowlevel
from starlette.types import Message, Receive, Scope

from orchestrator.errors import (
    BodyTooLargeError,
    InvalidArgumentError,
    OrchestratorError,
    UnsupportedEncodingError,
)

__all__ = [
    "DEFAULT_BODY_LIMITS",
    "BodyLimits",
    "BoundedBody",
    "JsonDepth",
    "body_scope",
    "check_head",
]

# A file of the largest size a policy allows by default (10 MiB) is ~14 MiB as base64; 32 MiB
# leaves room, and bounds what one request can make any surface hold.
MAX_BODY_BYTES: Final = 32 * 1024 * 1024
# Nesting no request of ours needs (tool arguments are a few levels deep); Python's parser
# recurses per level, and a few thousand levels would be its RecursionError.
MAX_JSON_DEPTH: Final = 64
# What one decompression step may produce: the loop turns between steps, so a bomb's expansion
# is spread over many short steps and other requests are served between them.
DECODE_STEP_BYTES: Final = 64 * 1024
# Codings stacked in one Content-Encoding ("gzip, gzip"): more is only ever an attack.
MAX_CODINGS: Final = 2
# Message-level codings of the RPC protocols on the E2B port: only identity is taken.
MESSAGE_CODING_HEADERS: Final = (b"connect-content-encoding", b"grpc-encoding")
_IDENTITY: Final = frozenset({"", "identity"})
_ZLIB_WBITS: Final = {"gzip": 31, "x-gzip": 31, "deflate": 15}
_JSON_TOKENS: Final = re.compile(rb'["\\\[\]{}]')
# A Connect streaming message: one flags byte and a four-byte big-endian length.
ENVELOPE_PREFIX: Final = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class BodyLimits:
    """The caps of one surface's bodies (bytes, nesting levels)."""

    max_raw_bytes: int = MAX_BODY_BYTES
    max_decoded_bytes: int = MAX_BODY_BYTES
    max_json_depth: int = MAX_JSON_DEPTH


DEFAULT_BODY_LIMITS: Final = BodyLimits()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def check_head(scope: Scope, limits: BodyLimits) -> list[str]:
    """The codings of the request's body, outermost last, checked from its head alone: a
    declared length over the raw cap (413) or a coding not taken (415) is refused here, before
    any byte of the body is read."""
    declared = (_header(scope, b"content-length") or "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > limits.max_raw_bytes:
        raise BodyTooLargeError(f"the request body is larger than {limits.max_raw_bytes} bytes")
    for name in MESSAGE_CODING_HEADERS:
        value = (_header(scope, name) or "").strip().lower()
        if value not in _IDENTITY:
            raise UnsupportedEncodingError(
                f"{name.decode()}: {value[:40]!r} is not taken: send messages uncompressed"
            )
    given = _header(scope, b"content-encoding") or ""
    codings = [c.strip().lower() for c in given.split(",") if c.strip().lower() not in _IDENTITY]
    unknown = [c for c in codings if c not in _ZLIB_WBITS]
    if unknown or len(codings) > MAX_CODINGS:
        taken = ", ".join(sorted(_ZLIB_WBITS))
        raise UnsupportedEncodingError(
            f"Content-Encoding {given[:80]!r} is not taken: {taken} or identity, at most "
            f"{MAX_CODINGS} stacked"
        )
    return codings


def body_scope(scope: Scope, codings: list[str]) -> Scope:
    """The scope the app sees: no Content-Encoding, and no Content-Length once decoded."""
    dropped = {b"content-encoding", *((b"content-length",) if codings else ())}
    headers = [(k, v) for k, v in scope.get("headers", ()) if k not in dropped]
    return {**scope, "headers": headers}


class _Decoder:
    """One coding undone as a stream; gzip members may follow one another (RFC 1952)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._wbits = _ZLIB_WBITS[coding]
        self._inflate = zlib.decompressobj(self._wbits)
        # Bytes this coding has given so far, for the whole body.
        self.produced = 0

    def pieces(self, data: bytes) -> Callable[[], bytes | None]:
        """A function giving the decoded output of ``data`` one bounded step at a time (None
        once ``data`` is used up)."""
        pending = [data]

        def step() -> bytes | None:
            while pending[0]:
                inflate = self._inflate
                if inflate.eof:
                    rest = inflate.unused_data
                    if self._wbits != 31 or not rest:
                        raise InvalidArgumentError(f"data after the end of the {self.coding} body")
                    self._inflate = inflate = zlib.decompressobj(self._wbits)
                    pending[0] = rest
                try:
                    out = inflate.decompress(pending[0], DECODE_STEP_BYTES)
                except zlib.error as exc:
                    raise InvalidArgumentError(
                        f"the body is not valid {self.coding}: {exc}"
                    ) from None
                pending[0] = inflate.unconsumed_tail or (
                    inflate.unused_data if inflate.eof else b""
                )
                if out:
                    return out
            return None

        return step

    def finish(self) -> None:
        if not self._inflate.eof:
            raise InvalidArgumentError(f"the body's {self.coding} data ends early")


class JsonDepth:
    """Counts JSON nesting as the bytes pass; ``enveloped`` for Connect's streaming framing."""

    def __init__(self, limit: int, *, enveloped: bool = False) -> None:
        self.limit = limit
        self.enveloped = enveloped
        self._depth = 0
        self._in_string = False
        self._escaped = False
        # Enveloped: bytes of the prefix still to skip, then bytes of the message to scan.
        self._prefix = bytearray()
        self._message_left = 0

    def feed(self, data: bytes) -> None:
        if not self.enveloped:
            self._scan(data)
            return
        view = memoryview(data)
        while view:
            if self._message_left == 0:
                take = ENVELOPE_PREFIX - len(self._prefix)
                self._prefix += view[:take]
                view = view[take:]
                if len(self._prefix) == ENVELOPE_PREFIX:
                    self._message_left = int.from_bytes(self._prefix[1:], "big")
                    self._prefix.clear()
                continue
            chunk = view[: self._message_left]
            self._message_left -= len(chunk)
            view = view[len(chunk) :]
            self._scan(bytes(chunk))

    def _scan(self, data: bytes) -> None:
        skip_to = 0
        if self._escaped and data:
            self._escaped, skip_to = False, 1
        for match in _JSON_TOKENS.finditer(data, skip_to):
            at = match.start()
            if at < skip_to:
                continue
            token = data[at]
            if self._in_string:
                if token == 0x5C:  # backslash: the next byte is escaped
                    if at + 1 < len(data):
                        skip_to = at + 2
                    else:
                        self._escaped = True
                elif token == 0x22:
                    self._in_string = False
            elif token == 0x22:
                self._in_string = True
            elif token in b"[{":
                self._depth += 1
                if self._depth > self.limit:
                    raise InvalidArgumentError(
                        f"the request body is nested more than {self.limit} levels deep"
                    )
            elif token in b"]}":
                self._depth -= 1


class BoundedBody:
    """The ``receive`` an app is given: ``raw`` bytes counted, decoded by ``codings`` as a
    stream, counted again, and (when ``json``) their nesting checked."""

    def __init__(
        self,
        receive: Receive,
        limits: BodyLimits,
        codings: list[str],
        *,
        json: JsonDepth | None = None,
    ) -> None:
        self._receive = receive
        self._limits = limits
        self._decoders = [_Decoder(c) for c in reversed(codings)]
        self._json = json
        self._raw = 0
        self._decoded = 0
        self._done = False
        self.refused: OrchestratorError | None = None

    async def receive(self) -> Message:
        if self.refused is not None:
            raise self.refused
        if self._done:
            return await self._receive()  # only http.disconnect comes after the body
        try:
            return await self._next()
        except OrchestratorError as exc:
            self.refused = exc
            raise

    async def _next(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request":
            return message
        raw = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        self._raw += len(raw)
        if self._raw > self._limits.max_raw_bytes:
            raise BodyTooLargeError(
                f"the request body is larger than {self._limits.max_raw_bytes} bytes"
            )
        decoded = await self._decode(raw, final=not more)
        self._count(decoded)
        self._done = not more
        return {"type": "http.request", "body": decoded, "more_body": more}

    async def _decode(self, data: bytes, *, final: bool) -> bytes:
        for decoder in self._decoders:
            step, pieces = decoder.pieces(data), []
            while (piece := step()) is not None:
                decoder.produced += len(piece)
                if decoder.produced > self._limits.max_decoded_bytes:
                    raise BodyTooLargeError(
                        f"the request body decodes to more than "
                        f"{self._limits.max_decoded_bytes} bytes"
                    )
                pieces.append(piece)
                await anyio.lowlevel.checkpoint()
            if final:
                decoder.finish()
            data = b"".join(pieces)
        return data

    def _count(self, decoded: bytes) -> None:
        self._decoded += len(decoded)
        if self._decoded > self._limits.max_decoded_bytes:
            raise BodyTooLargeError(
                f"the request body decodes to more than {self._limits.max_decoded_bytes} bytes"
            )
        if self._json is not None:
            self._json.feed(decoded)
