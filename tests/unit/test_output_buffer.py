"""The terminal output buffer: cursors, caps, gaps and waiting, with no clock and no I/O."""

from __future__ import annotations

import anyio
import pytest

from orchestrator.errors import InvalidArgumentError
from orchestrator.session.terminal.output_buffer import OutputBuffer

pytestmark = pytest.mark.anyio


def filled(*parts: bytes, max_bytes: int = 1 << 20, chunk_bytes: int = 1024) -> OutputBuffer:
    buffer = OutputBuffer(max_bytes=max_bytes, chunk_bytes=chunk_bytes)
    for part in parts:
        buffer.append(part)
    return buffer


def test_a_read_without_a_cursor_starts_at_the_beginning() -> None:
    buffer = filled(b"hello ", b"world")
    got = buffer.read(max_bytes=100)
    assert got.data == b"hello world"
    assert (got.next_offset, got.gap, got.has_more) == (11, False, False)


def test_a_seq_cursor_returns_exactly_what_came_after_it() -> None:
    buffer = filled(b"one")
    first = buffer.read(since_seq=0, max_bytes=100)
    buffer.append(b"two")
    buffer.read(max_bytes=100)  # another reader, elsewhere: changes nothing for this one
    buffer.append(b"three")
    second = buffer.read(since_seq=first.next_seq, max_bytes=100)
    assert (first.data, second.data) == (b"one", b"twothree")
    assert second.next_offset == len(b"onetwothree")
    assert buffer.read(since_seq=second.next_seq, max_bytes=100).data == b""


def test_an_offset_cursor_returns_exactly_what_came_after_it() -> None:
    buffer = filled(b"abcdef")
    assert buffer.read(since_offset=4, max_bytes=100).data == b"ef"
    buffer.append(b"gh")
    got = buffer.read(since_offset=6, max_bytes=100)
    assert (got.data, got.next_offset) == (b"gh", 8)


def test_a_seq_read_returns_whole_chunks_within_max_bytes() -> None:
    buffer = filled(chunk_bytes=4)
    for part in (b"aaaa", b"bbbb", b"cccc"):
        buffer.append(part)
        buffer.read(max_bytes=1)  # freeze the chunk so the next append starts a new one
    got = buffer.read(since_seq=0, max_bytes=9)
    assert (got.data, got.next_seq, got.has_more) == (b"aaaabbbb", 2, True)
    rest = buffer.read(since_seq=got.next_seq, max_bytes=9)
    assert (rest.data, rest.has_more) == (b"cccc", False)


def test_an_offset_read_stops_at_max_bytes_and_never_splits_a_character() -> None:
    buffer = filled("aé".encode())  # 61 c3 a9
    got = buffer.read(since_offset=0, max_bytes=2)
    assert (got.data, got.next_offset, got.has_more) == (b"a", 1, True)
    assert buffer.read(since_offset=got.next_offset, max_bytes=2).data == "é".encode()


def test_a_seq_cursor_after_a_partly_read_chunk_repeats_it_rather_than_skip_it() -> None:
    buffer = filled(b"abcdef")
    got = buffer.read(since_offset=0, max_bytes=3)
    assert buffer.read(since_seq=got.next_seq, max_bytes=100).data == b"abcdef"


def test_small_writes_share_a_chunk_until_a_reader_has_seen_it() -> None:
    buffer = filled(b"a", b"b", b"c")
    assert buffer.next_seq == 1
    seen = buffer.read(since_seq=0, max_bytes=100)
    buffer.append(b"d")
    assert buffer.next_seq == 2
    assert buffer.read(since_seq=seen.next_seq, max_bytes=100).data == b"d"


def test_the_oldest_output_is_dropped_to_keep_the_cap() -> None:
    buffer = filled(b"x" * 10_000, max_bytes=4096)
    assert buffer.retained_bytes <= 4096
    assert buffer.dropped_total == 10_000 - buffer.retained_bytes
    assert buffer.end_offset == 10_000


def test_a_seq_cursor_into_dropped_output_reports_the_gap() -> None:
    buffer = filled(max_bytes=8, chunk_bytes=4)
    for part in (b"1111", b"2222", b"3333"):
        buffer.append(part)
        buffer.read(since_seq=buffer.next_seq, max_bytes=4)
        buffer.read(max_bytes=100)
    got = buffer.read(since_seq=0, max_bytes=100)
    assert got.gap
    assert (got.data, got.dropped_chunks, got.dropped_bytes) == (b"22223333", 1, None)


def test_an_offset_cursor_into_dropped_output_reports_how_many_bytes_were_lost() -> None:
    buffer = filled(b"a" * 3000, b"b" * 3000, max_bytes=4096)
    got = buffer.read(since_offset=100, max_bytes=10_000)
    assert got.gap
    assert got.dropped_bytes == buffer.first_offset - 100
    assert got.data.endswith(b"b" * 3000)
    assert got.next_offset == 6000


def test_an_offset_cursor_still_retained_reports_no_gap() -> None:
    buffer = filled(b"a" * 3000, b"b" * 3000, max_bytes=4096)
    got = buffer.read(since_offset=buffer.first_offset, max_bytes=10_000)
    assert (got.gap, got.dropped_bytes) == (False, None)


def test_a_large_write_is_cut_into_chunks_on_character_boundaries() -> None:
    text = "ab€" * 1000  # € is three bytes
    buffer = filled(text.encode(), chunk_bytes=64)
    pieces = []
    cursor = 0
    while cursor < buffer.next_seq:
        got = buffer.read(since_seq=cursor, max_bytes=64)
        assert len(got.data) <= 64
        pieces.append(got.data.decode())  # each piece decodes on its own
        cursor = got.next_seq
    assert "".join(pieces) == text


def test_a_character_split_across_writes_is_held_until_it_is_whole() -> None:
    euro = "€".encode()
    buffer = filled(b"x" + euro[:2])
    assert buffer.read(max_bytes=100).data == b"x"
    buffer.append(euro[2:])
    assert buffer.read(since_offset=1, max_bytes=100).data == euro


def test_closing_stores_an_unfinished_character_as_it_is() -> None:
    buffer = filled(b"x\xe2\x82")
    buffer.close()
    got = buffer.read(max_bytes=100)
    assert (got.data, got.complete) == (b"x\xe2\x82", True)


def test_the_chunk_count_stays_bounded_when_reads_interleave_with_tiny_writes() -> None:
    buffer = OutputBuffer(max_bytes=4096)
    for _ in range(10_000):
        buffer.append(b"z")
        buffer.read(since_seq=buffer.next_seq - 1, max_bytes=4096)
    assert buffer.next_seq - buffer.first_seq <= 64
    assert buffer.read(since_seq=0, max_bytes=4096).gap


@pytest.mark.parametrize(
    "cursor",
    [{"since_seq": -1}, {"since_offset": -1}, {"since_seq": True}, {"since_offset": 1.0}],
)
def test_a_malformed_cursor_is_an_invalid_argument(cursor: dict[str, object]) -> None:
    buffer = filled(b"abc")
    with pytest.raises(InvalidArgumentError):
        buffer.read(**cursor, max_bytes=10)  # type: ignore[arg-type]


def test_a_cursor_past_the_end_is_an_invalid_argument() -> None:
    buffer = filled(b"abc")
    with pytest.raises(InvalidArgumentError):
        buffer.read(since_offset=4, max_bytes=10)
    with pytest.raises(InvalidArgumentError):
        buffer.read(since_seq=2, max_bytes=10)


def test_two_cursors_at_once_are_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        filled(b"abc").read(since_seq=0, since_offset=0, max_bytes=10)
    assert caught.value.code == "invalid_argument"


def test_the_end_is_reported_only_once_everything_was_read() -> None:
    buffer = filled(b"abcdef")
    buffer.close()
    assert not buffer.read(max_bytes=3).complete
    assert buffer.read(since_offset=3, max_bytes=3).complete


async def test_waiting_returns_as_soon_as_new_output_arrives() -> None:
    buffer = filled(b"old")
    cursor = buffer.read(max_bytes=100).next_seq
    woke = anyio.Event()

    async def waiter() -> None:
        assert await buffer.wait(since_seq=cursor, timeout=30)
        woke.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not woke.is_set()
            buffer.append(b"new")
        assert woke.is_set()


async def test_waiting_returns_when_the_output_ends() -> None:
    buffer = filled()

    async def closer() -> None:
        await anyio.wait_all_tasks_blocked()
        buffer.close()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(closer)
            assert await buffer.wait(since_offset=0, timeout=30)


async def test_waiting_with_nothing_new_times_out_with_false() -> None:
    buffer = filled(b"seen")
    with anyio.fail_after(5):
        assert not await buffer.wait(since_offset=4, timeout=0)
        assert await buffer.wait(since_offset=0, timeout=0)
