"""The end of a proxy's accounting, on the host: the real connection handler (``Proxy.handle``) on
a loopback port and its control socket (``Proxy.control``) on a Unix socket, as the proxy's
container runs them. ``final`` answers totals that count every byte the proxy moved (the totals
file, rewritten once a ``TICK``, lags behind), and from then on nothing moves: open connections
are closed and new attempts refused with ``session.ended``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backend.network_log import EgressCounters, parse_counters, parse_log
from orchestrator.worker.egress_proxy import ENDED_RULE, MAX_HEAD_BYTES, Proxy, Settings
from tests.unit.test_egress_proxy import _client_hello

TOKEN = "end-token"
AUTH = "Proxy-Authorization: Basic " + base64.b64encode(f"sandbox:{TOKEN}".encode()).decode()
# Every wait of a test: far above what loopback takes, far below a hung test's cost.
WAIT = 10.0
BODY = 300_000


@dataclass
class Rig:
    proxy: Proxy
    proxy_port: int
    upstream_port: int
    control_path: str
    # What the upstream read of each connection.
    upstream_heads: list[bytes]


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _rig(folder: Path, serve: Serve) -> AsyncIterator[Rig]:
    heads: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            await serve(reader, writer)
        writer.close()

    up_server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = up_server.sockets[0].getsockname()[1]
    settings = Settings(
        token=TOKEN, mode="allowlist", allow=[f"localhost:{up_port}"],
        permit=[ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")],
        max_connections=8, max_bytes=1 << 30, idle_timeout=WAIT, max_connection=WAIT,
        log_path=str(folder / "log.jsonl"), allow_path=str(folder / "allow.json"),
        stats_path=str(folder / "stats.json"), refuse_path=str(folder / "refuse.json"),
        control_path=str(folder / "control.sock"),
    )  # fmt: skip
    proxy = Proxy(settings)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)
    control = await asyncio.start_unix_server(proxy.control, path=settings.control_path)
    async with up_server, server, control:
        yield Rig(proxy, server.sockets[0].getsockname()[1], up_port, settings.control_path, heads)


async def _final(rig: Rig, line: bytes = b"final\n") -> bytes:
    reader, writer = await asyncio.open_unix_connection(rig.control_path)
    try:
        writer.write(line)
        writer.write_eof()
        return await reader.read()
    finally:
        writer.close()


async def _get(rig: Rig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.proxy_port)
    target = f"http://localhost:{rig.upstream_port}/"
    writer.write(f"GET {target} HTTP/1.1\r\n{AUTH}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def _answer_body(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {BODY}\r\n\r\n".encode() + b"x" * BODY)
    await writer.drain()


def _counters(answer: bytes) -> EgressCounters:
    counters = parse_counters(answer)
    assert counters is not None, answer
    return counters


def test_final_counts_a_download_that_ended_just_before_it_and_nothing_moves_after(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with _rig(tmp_path, _answer_body) as rig, asyncio.timeout(WAIT):
            reader, writer = await _get(rig)
            got = await reader.read()
            writer.close()
            assert got.endswith(b"x" * 100) and len(got) > BODY
            while rig.proxy.active:  # noqa: ASYNC110 (no event: the handler's end)
                await asyncio.sleep(0.01)
            # Well within one TICK of the download: the file the proxy rewrites each TICK may
            # not have it yet, the answer must.
            answer = await _final(rig)
            counters = _counters(answer)
            assert counters.bytes_received == len(got)
            assert counters.bytes_sent == len(rig.upstream_heads[0])
            written = await asyncio.to_thread(Path(rig.proxy.settings.stats_path).read_bytes)
            assert _counters(written) == counters
            # After the end: refused with its rule, and the upstream is never reached.
            reader, writer = await _get(rig)
            refused = await reader.read()
            writer.close()
            assert refused.startswith(b"HTTP/1.1 403")
            assert f"X-Sandhold-Egress-Rule: {ENDED_RULE}".encode() in refused
            assert len(rig.upstream_heads) == 1
            # Nothing lifts it, not the refusal file's absence on the next tick.
            rig.proxy.refresh_refusal()
            assert rig.proxy.refusal == ENDED_RULE

    asyncio.run(scenario())
    entries = parse_log((tmp_path / "log.jsonl").read_bytes())
    assert [(e["decision"], e["rule"]) for e in entries][-1] == ("deny", ENDED_RULE)


def test_final_closes_an_open_download_and_its_totals_are_exactly_what_the_client_got(
    tmp_path: Path,
) -> None:
    streaming = asyncio.Event()

    async def stream_forever(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
        while True:
            writer.write(b"y" * 16384)
            await writer.drain()
            streaming.set()
            await asyncio.sleep(0.001)

    async def scenario() -> None:
        async with _rig(tmp_path, stream_forever) as rig, asyncio.timeout(WAIT):
            reader, writer = await _get(rig)
            await streaming.wait()
            first = await reader.read(50_000)
            counters = _counters(await _final(rig))
            rest = await reader.read()  # to the end: the proxy closed the connection
            writer.close()
            assert first and counters.bytes_received == len(first) + len(rest)
            assert not rig.proxy.open

    asyncio.run(scenario())


def test_a_tunnel_opened_before_the_end_forwards_nothing_after_it(tmp_path: Path) -> None:
    """``CONNECT`` answered, then the end, then the ClientHello: the proxy was waiting for the
    hello, not yet connected upstream, and must not forward it once the accounting is over."""
    received: list[bytes] = []

    async def keep_all(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read())

    async def scenario() -> None:
        async with _rig(tmp_path, keep_all) as rig, asyncio.timeout(WAIT):
            reader, writer = await asyncio.open_connection("127.0.0.1", rig.proxy_port)
            writer.write(
                f"CONNECT localhost:{rig.upstream_port} HTTP/1.1\r\n{AUTH}\r\n\r\n".encode()
            )
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            counters = _counters(await _final(rig))
            writer.write(_client_hello("localhost"))
            writer.write_eof()
            assert await reader.read() == b""  # closed, nothing relayed either way
            writer.close()
            while rig.proxy.active:  # noqa: ASYNC110 (no event: the handler's end)
                await asyncio.sleep(0.01)
            assert not any(received) and rig.proxy.sent == counters.bytes_sent == 0

    asyncio.run(scenario())
    entries = parse_log((tmp_path / "log.jsonl").read_bytes())
    assert [(e["method"], e["decision"], e["rule"]) for e in entries] == [
        ("CONNECT", "deny", ENDED_RULE)
    ]


def test_any_other_control_line_is_closed_unanswered_and_ends_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _rig(tmp_path, _answer_body) as rig, asyncio.timeout(WAIT):
            for line in (b"totals\n", b"final", b"final\r\n", b"x" * 200 + b"\n"):
                assert await _final(rig, line) == b""
            assert rig.proxy.refusal is None
            reader, writer = await _get(rig)
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()

    asyncio.run(scenario())
