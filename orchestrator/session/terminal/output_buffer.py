"""A bounded buffer of a program's output, read through cursors. Pure: no I/O, no clock.

Output is kept as numbered chunks, each with its absolute byte offset in the whole output. A
reader holds a cursor, either ``since_seq`` (a chunk number) or ``since_offset`` (a byte offset),
and gets exactly what came after it, with the cursors to pass next time.

Invariants:
- Retained bytes never exceed ``max_bytes``: the oldest chunks are dropped first. A cursor that
  points into dropped output gets what is left and a gap report, never a silent skip.
- Chunks hold at most ``chunk_bytes`` and are cut on UTF-8 character boundaries (up to three bytes
  of an unfinished character wait for the rest, or for ``close``), so a read never splits one.
- A chunk that no read has touched yet may grow (small writes coalesce, bounding the chunk count);
  one a reader has seen never changes, so a ``next_seq`` handed out stays exact.
- A seq read returns whole chunks only, at least one; a reader whose ``max_bytes`` is at least
  ``chunk_bytes`` therefore never gets more than it asked for.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass

import anyio

from orchestrator.errors import InvalidArgumentError

__all__ = ["CHUNK_BYTES", "OutputBuffer"]

# Small enough that any sensible read limit holds a whole chunk, large enough that the per-chunk
# overhead (~120 bytes) stays a small fraction of the data.
CHUNK_BYTES = 1024
# A backstop for readers that poll between tiny writes (each read freezes the newest chunk).
MIN_CHUNK_BUDGET = 16
CHUNK_OVERHEAD_RATIO = 64


@dataclass(frozen=True, slots=True)
class Chunk:
    seq: int
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputSlice:
    """What one read returns. ``dropped_*`` is None when the cursor's kind cannot tell."""

    data: bytes
    next_seq: int
    next_offset: int
    gap: bool = False
    dropped_bytes: int | None = None
    dropped_chunks: int | None = None
    has_more: bool = False
    complete: bool = False


class OutputBuffer:
    def __init__(self, *, max_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        if min(max_bytes, chunk_bytes) < 4:
            raise ValueError("max_bytes and chunk_bytes must be at least 4")
        self.max_bytes = max_bytes
        self.chunk_bytes = min(chunk_bytes, max_bytes)
        self._max_chunks = max(MIN_CHUNK_BUDGET, max_bytes // CHUNK_OVERHEAD_RATIO)
        self._chunks: deque[Chunk] = deque()
        self._next_seq = 0
        self._end_offset = 0
        self._retained = 0
        self._delivered_seq = -1
        self._unfinished = b""
        self._closed = False
        self._changed = anyio.Event()
        self.dropped_total = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def next_seq(self) -> int:
        """The seq the next new chunk will get: a cursor at the end of the output."""
        return self._next_seq

    @property
    def end_offset(self) -> int:
        return self._end_offset

    @property
    def first_seq(self) -> int:
        return self._chunks[0].seq if self._chunks else self._next_seq

    @property
    def first_offset(self) -> int:
        return self._chunks[0].offset if self._chunks else self._end_offset

    @property
    def retained_bytes(self) -> int:
        return self._retained

    def append(self, data: bytes) -> None:
        if self._closed:
            raise RuntimeError("append to a closed output buffer")
        if not data:
            return
        data = self._unfinished + data
        complete = len(data) - _unfinished_tail(data)
        self._unfinished = data[complete:]
        self._store(data[:complete])

    def close(self) -> None:
        """The output has ended; whatever was held back is stored as it is."""
        if self._closed:
            return
        self._store(self._unfinished)
        self._unfinished = b""
        self._closed = True
        self._notify()

    def _store(self, data: bytes) -> None:
        while data:
            last = self._chunks[-1] if self._chunks else None
            if last is not None and last.seq > self._delivered_seq:
                room = self.chunk_bytes - len(last.data)
                if room > 0:
                    cut = _boundary(data, room) if len(data) > room else len(data)
                    if cut > 0:
                        self._chunks[-1] = Chunk(last.seq, last.offset, last.data + data[:cut])
                        self._account(data[:cut])
                        data = data[cut:]
                        continue
            cut = _boundary(data, self.chunk_bytes) if len(data) > self.chunk_bytes else len(data)
            cut = cut or min(len(data), self.chunk_bytes)
            self._chunks.append(Chunk(self._next_seq, self._end_offset, data[:cut]))
            self._next_seq += 1
            self._account(data[:cut])
            data = data[cut:]
        self._trim()
        self._notify()

    def _account(self, piece: bytes) -> None:
        self._end_offset += len(piece)
        self._retained += len(piece)

    def _trim(self) -> None:
        while self._chunks and (
            self._retained > self.max_bytes or len(self._chunks) > self._max_chunks
        ):
            dropped = self._chunks.popleft()
            self._retained -= len(dropped.data)
            self.dropped_total += len(dropped.data)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # -- reading ------------------------------------------------------------------------------

    def has_new(self, *, since_seq: int | None = None, since_offset: int | None = None) -> bool:
        """Whether a read with this cursor would return output (or report a gap)."""
        if since_seq is not None:
            _check_cursor(since_seq, "since_seq", self._next_seq)
            return since_seq < self._next_seq
        offset = 0 if since_offset is None else since_offset
        _check_cursor(offset, "since_offset", self._end_offset)
        return offset < self._end_offset

    def read(
        self, *, since_seq: int | None = None, since_offset: int | None = None, max_bytes: int
    ) -> OutputSlice:
        """Output after the cursor, at most ``max_bytes`` (see the seq rule in the module doc).
        Without a cursor, reading starts at the beginning of the output."""
        if since_seq is not None and since_offset is not None:
            raise InvalidArgumentError("give since_seq or since_offset, not both")
        if max_bytes < 1:
            raise InvalidArgumentError("max_bytes must be positive")
        if since_seq is not None:
            _check_cursor(since_seq, "since_seq", self._next_seq)
            return self._read_seq(since_seq, max_bytes)
        offset = 0 if since_offset is None else since_offset
        _check_cursor(offset, "since_offset", self._end_offset)
        return self._read_offset(offset, max_bytes)

    def _read_seq(self, seq: int, max_bytes: int) -> OutputSlice:
        first = self.first_seq
        gap = seq < first
        start = max(seq, first) - first
        taken: list[Chunk] = []
        size = 0
        for chunk in itertools.islice(self._chunks, start, None):
            if taken and size + len(chunk.data) > max_bytes:
                break
            taken.append(chunk)
            size += len(chunk.data)
        if taken:
            self._delivered_seq = max(self._delivered_seq, taken[-1].seq)
            next_seq, next_offset = taken[-1].seq + 1, taken[-1].end
        else:
            next_seq, next_offset = self._next_seq, self._end_offset
        return OutputSlice(
            data=b"".join(chunk.data for chunk in taken),
            next_seq=next_seq,
            next_offset=next_offset,
            gap=gap,
            dropped_chunks=first - seq if gap else None,
            has_more=next_seq < self._next_seq,
            complete=self._closed and next_seq == self._next_seq,
        )

    def _read_offset(self, requested: int, max_bytes: int) -> OutputSlice:
        first = self.first_offset
        offset = max(requested, first)
        index = bisect.bisect_right(self._chunks, offset, key=lambda chunk: chunk.offset) - 1
        pieces: list[bytes] = []
        size = 0
        for chunk in itertools.islice(self._chunks, max(index, 0), None):
            if size >= max_bytes:
                break
            piece = chunk.data[max(offset - chunk.offset, 0) :]
            if size + len(piece) > max_bytes:
                room = max_bytes - size
                piece = piece[: _boundary(piece, room) or room]
            pieces.append(piece)
            size += len(piece)
            self._delivered_seq = max(self._delivered_seq, chunk.seq)
        next_offset = offset + size
        return OutputSlice(
            data=b"".join(pieces),
            next_seq=self._seq_at(next_offset),
            next_offset=next_offset,
            gap=requested < first,
            dropped_bytes=first - requested if requested < first else None,
            has_more=next_offset < self._end_offset,
            complete=self._closed and next_offset == self._end_offset,
        )

    def _seq_at(self, offset: int) -> int:
        """The chunk holding ``offset``: a seq cursor repeats a partly read chunk, never skips."""
        if offset >= self._end_offset:
            return self._next_seq
        index = bisect.bisect_right(self._chunks, offset, key=lambda chunk: chunk.offset) - 1
        return self._chunks[max(index, 0)].seq

    # -- waiting ------------------------------------------------------------------------------

    async def wait(
        self, *, since_seq: int | None = None, since_offset: int | None = None, timeout: float
    ) -> bool:
        """Until a read with this cursor has something or the output ends; False on timeout."""
        with anyio.move_on_after(timeout):
            while True:
                changed = self._changed
                if self._closed or self.has_new(since_seq=since_seq, since_offset=since_offset):
                    return True
                await changed.wait()
        return self._closed or self.has_new(since_seq=since_seq, since_offset=since_offset)


def _check_cursor(value: object, name: str, end: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative integer")
    if value > end:
        raise InvalidArgumentError(f"{name} {value} is past the end of the output ({end})")


def _boundary(data: bytes, limit: int) -> int:
    """The largest cut at or before ``limit`` that does not split a UTF-8 character; 0 if the
    bytes there are not UTF-8 (the caller then cuts at ``limit``)."""
    for cut in range(limit, max(limit - 4, 0), -1):
        if cut >= len(data) or data[cut] & 0xC0 != 0x80:
            return cut
    return 0


def _unfinished_tail(data: bytes) -> int:
    """How many trailing bytes are the start of a UTF-8 character still missing its rest."""
    for back in range(1, min(3, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        if byte >= 0xF0:
            need = 4
        elif byte >= 0xE0:
            need = 3
        elif byte >= 0xC0:
            need = 2
        else:
            return 0
        return back if back < need else 0
    return 0
