"""The egress proxy as a whole, fuzzed on the host: its real connection handler (``Proxy.handle``)
on a loopback port, an upstream that records every byte it is sent, and hypothesis writing what
a hostile sandbox could send (request heads of every shape, bodies framed right and wrong,
pipelined requests, TLS hellos for the right and the wrong name, plain noise).

After every input: the proxy answered or closed within its bounds and holds no connection; the
upstream got nothing unless the request was allowed, and then exactly one request, for the
checked host, with no byte past its framed body (nothing smuggled, nothing pipelined, no forged
``Host``); every attempt is one log line that the orchestrator's reader keeps.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.backend.network_log import parse_log
from orchestrator.worker.egress_proxy import MAX_HEAD_BYTES, Proxy, Settings, chunk_size
from tests.unit.test_egress_proxy import _client_hello

TOKEN = "fuzz-token"
AUTH = "Proxy-Authorization: Basic " + base64.b64encode(f"sandbox:{TOKEN}".encode()).decode()
# Every wait of one input is bounded by this: the proxy's own bounds are set below it.
INPUT_TIMEOUT = 5.0


HELLO_RIGHT = _client_hello("localhost")
HELLO_WRONG = _client_hello("other.example")


class Upstream:
    """A server that keeps every byte of every connection and answers one small response."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        with contextlib.suppress(TimeoutError, OSError):
            while chunk := await asyncio.wait_for(reader.read(65536), 0.1):
                data += chunk
        self.received.append(data)
        with contextlib.suppress(OSError):
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()


def _settings(folder: Path, port: int) -> Settings:
    return Settings(
        token=TOKEN,
        mode="allowlist",
        allow=[f"localhost:{port}"],
        permit=[ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")],
        max_connections=8,
        max_bytes=1 << 20,
        idle_timeout=0.5,
        max_connection=2.0,
        log_path=str(folder / "log.jsonl"),
        allow_path=str(folder / "allow.json"),
        stats_path=str(folder / "stats.json"),
        refuse_path=str(folder / "refuse.json"),
    )


async def _exchange(folder: Path, make_input: Any) -> tuple[bytes, list[bytes], Proxy, int]:
    """Send one input (made knowing the upstream's port) and read the answer to its end."""
    upstream = Upstream()
    up_server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    port = up_server.sockets[0].getsockname()[1]
    proxy = Proxy(_settings(folder, port))
    await asyncio.to_thread(Path(proxy.settings.log_path).write_text, "")
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)
    proxy_port = server.sockets[0].getsockname()[1]
    data = make_input(port)
    answer = b""
    async with server, up_server:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        try:
            with contextlib.suppress(OSError):
                writer.write(data)
                await writer.drain()
                writer.write_eof()
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                async with asyncio.timeout(INPUT_TIMEOUT):
                    while chunk := await reader.read(65536):
                        answer += chunk
        finally:
            writer.close()
        async with asyncio.timeout(INPUT_TIMEOUT):
            while proxy.active or proxy.open:  # noqa: ASYNC110 (no event: the handler's end)
                await asyncio.sleep(0.01)
    return answer, upstream.received, proxy, port


def _run(tmp_path: Path, make_input: Any) -> tuple[bytes, list[bytes], Proxy, int]:
    folder = tmp_path / f"in-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    return asyncio.run(_exchange(folder, make_input))


def _check_log(proxy: Proxy, made_attempt: bool) -> list[dict[str, Any]]:
    written = Path(proxy.settings.log_path).read_bytes()
    lines = [line for line in written.splitlines() if line]
    kept = parse_log(written)
    assert len(kept) == len(lines), "the proxy wrote a log line the orchestrator drops"
    assert len(lines) == (1 if made_attempt else 0)
    return kept


def _forwarded_request(raw: bytes, port: int) -> tuple[list[str], bytes]:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, raw[:200]
    assert not re.search(rb"[\r\n]", head.replace(b"\r\n", b"")), head  # no bare CR or LF
    lines = head.decode("latin-1").split("\r\n")
    hosts = [line for line in lines[1:] if line.split(":", 1)[0].strip().lower() == "host"]
    assert hosts == [f"Host: localhost:{port}"], lines
    assert "Connection: close" in lines
    assert not any(line.lower().startswith("proxy-authorization") for line in lines)
    return lines, rest


def _assert_body_is_framed(lines: list[str], body: bytes) -> None:
    """Nothing past the body the head frames: its Content-Length, or well-formed chunks up to
    the last chunk and its trailers (a client that stopped early leaves a shorter prefix)."""
    fields = {line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1] for line in lines[1:]}
    if "transfer-encoding" not in fields:
        assert len(body) <= int(fields.get("content-length", "0").strip() or 0)
        return
    rest = body
    while b"\r\n" in rest:
        line, _, rest = rest.partition(b"\r\n")
        size = chunk_size(line + b"\r\n")  # every size line that went up is one
        if size == 0:
            # Trailer lines, then the empty line, and nothing after it.
            trailers, sep, after = rest.partition(b"\r\n\r\n")
            if rest.startswith(b"\r\n"):
                trailers, sep, after = b"", b"\r\n", rest[2:]
            assert after == b"" and (sep or b"\r\n" not in trailers[-2:]), rest[:100]
            return
        chunk, rest = rest[: size + 2], rest[size + 2 :]
        assert len(chunk) < size + 2 or chunk.endswith(b"\r\n"), chunk[-10:]
    assert len(rest) < 64  # a size line cut short, not a body


methods = st.sampled_from(["GET", "POST", "PUT", "HEAD", "CONNECT", "DELETE"] * 5) | st.text(
    st.characters(codec="latin-1", exclude_characters="\r\n "), min_size=1, max_size=400
)
header_lines = st.lists(
    st.sampled_from(
        [
            AUTH,
            "Proxy-Authorization: Basic d3Jvbmc=",
            "Host: other.example",
            "host: other.example:80",
            "Content-Length: 5",
            "Content-Length: 0",
            "Content-Length: -3",
            "Content-Length: 99999999999999999",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: gzip",
            "Connection: keep-alive",
            "Upgrade: websocket",
            "Accept: */*",
        ]
    )
    # Well-formed lines of any name and value, then lines of anything at all.
    | st.builds(
        "{}: {}".format,
        st.text(
            st.characters(codec="ascii", categories=["L", "N"], include_characters="-_"),
            min_size=1,
            max_size=20,
        ),
        st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=60),
    )
    | st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=80),
    max_size=6,
)
# Allowed targets several times over: most inputs should get past the rules, where the
# framing and forwarding are.
targets = st.sampled_from(
    ["http://localhost:{port}/x", "http://localhost:{port}/x", "localhost:{port}",
     "localhost:{port}", "http://other.example/", "http://127.0.0.1:{port}/",
     "http://[::1]:{port}/", "/relative", "http://user@localhost:{port}/"]
)  # fmt: skip
# What a client could slip into a request line to make a proxy that forwards it whole write a
# line of the client's: bare line breaks (a header after them), other control bytes, non-ASCII.
INJECTED = st.sampled_from(
    ["\n", "\r", "\nHost:evil.example", "\rHost:evil.example", "\r\nHost:evil.example",
     "\t", "\x00", "\x0b", "\x0c", "\x7f", "\x85", "\xa0", "\xff"]
)  # fmt: skip


def _inject(target: str, junk: str, at: int) -> str:
    at %= len(target) + 1
    return target[:at] + junk + target[at:]


# An allowed target with something injected at any place of it.
injected_targets = st.builds(
    _inject,
    st.sampled_from(["http://localhost:{port}/x", "localhost:{port}"]),
    INJECTED,
    st.integers(min_value=0),
)
# The request line the proxy sends up for an allowed plain request: nothing but its own parts.
FORWARDED_LINE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32} /[\x21-\x7e]* HTTP/1\.[01]")
bodies = st.sampled_from(
    [b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n", b"5\r\nhello\r\n0\r\nX: y\r\n\r\n",
     b"zz\r\nbad\r\n", b"hello" + b"GET http://other.example/ HTTP/1.1\r\nHost: x\r\n\r\n",
     HELLO_RIGHT, HELLO_WRONG, HELLO_RIGHT + b"after the hello"]
) | st.binary(max_size=300)  # fmt: skip


def _exchange_and_check(
    tmp_path: Path, method: str, target: str, version: str, headers: list[str], body: bytes,
    pipelined: bool,
) -> None:  # fmt: skip
    def make(port: int) -> bytes:
        # Replaced, not formatted: an injected byte may have landed inside the placeholder.
        head = f"{method} {target.replace('{port}', str(port))} {version}\r\n"
        head += "".join(h + "\r\n" for h in headers) + "\r\n"
        extra = f"GET http://other.example/ HTTP/1.1\r\n{AUTH}\r\n\r\n" if pipelined else ""
        return head.encode("latin-1") + body + extra.encode()

    answer, received, proxy, port = _run(tmp_path, make)
    assert answer == b"" or answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), answer[:200]
    entry = _check_log(proxy, made_attempt=True)[0]
    kind = "CONNECT" if entry["method"] == "CONNECT" else "HTTP"
    event(f"{kind} {entry['decision']} {entry['rule'].split(':')[0][:20]}")
    forwarded = [raw for raw in received if raw]
    if entry["decision"] == "deny":
        assert forwarded == [], (entry, forwarded)
        return
    assert len(received) == 1
    if kind == "CONNECT":
        # A tunnel opens only after a ClientHello for the CONNECT host, which goes up first.
        assert not forwarded or forwarded[0].startswith(HELLO_RIGHT)
        return
    lines, rest = _forwarded_request(forwarded[0], port)
    # The request line went up whole and as one line: a bare CR or LF in the client's (in its
    # target or after its version) would have put a line of the client's before the proxy's.
    assert FORWARDED_LINE.fullmatch(lines[0]) and lines[0].startswith(f"{method} /"), lines[0]
    # What follows the framed body (a pipelined request, smuggled bytes) never goes up; bytes
    # inside it do, as body, which the server reads as body too.
    _assert_body_is_framed(lines, rest)


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


versions = st.sampled_from(
    ["HTTP/1.1"] * 4 + ["HTTP/1.0", "HTTP/2", "HTTP/1.2", "HTTP/1.", "http/1.1", "HTTP/1.10"]
) | st.builds(str.__add__, st.sampled_from(["HTTP/1.1", "HTTP/1.0"]), INJECTED)


@settings(FUZZ, max_examples=250)
@given(method=methods, target=targets | injected_targets, version=versions, headers=header_lines,
       body=bodies, pipelined=st.booleans())  # fmt: skip
def test_any_request_is_answered_bounded_logged_and_forwards_only_what_was_checked(
    tmp_path: Path, method: str, target: str, version: str, headers: list[str], body: bytes,
    pipelined: bool,
) -> None:  # fmt: skip
    _exchange_and_check(tmp_path, method, target, version, [AUTH, *headers], body, pipelined)


# Only requests the rules let through, to reach the forwarding: the body's framing is fuzzed.
framing_headers = st.lists(
    st.sampled_from(
        ["Content-Length: 0", "Content-Length: 3", "Content-Length: 5", "Content-Length: 300",
         "Transfer-Encoding: chunked", "Host: other.example", "Connection: keep-alive",
         "Accept: */*", "Expect: 100-continue"]
    ),
    max_size=3,
)  # fmt: skip
chunked_bodies = st.lists(st.binary(min_size=1, max_size=40), max_size=4).map(
    lambda parts: b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
)


@settings(FUZZ, max_examples=200)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD"]), headers=framing_headers,
       body=bodies | chunked_bodies | chunked_bodies.map(lambda b: b + b"smuggled"),
       pipelined=st.booleans())  # fmt: skip
def test_an_allowed_requests_body_goes_up_as_framed_and_nothing_after_it(
    tmp_path: Path, method: str, headers: list[str], body: bytes, pipelined: bool
) -> None:
    target = "http://localhost:{port}/path"
    _exchange_and_check(tmp_path, method, target, "HTTP/1.1", [AUTH, *headers], body, pipelined)


@settings(FUZZ, max_examples=150)
@given(noise=st.binary(max_size=2000))
def test_noise_is_refused_or_dropped_and_never_reaches_the_upstream(
    tmp_path: Path, noise: bytes
) -> None:
    answer, received, proxy, _ = _run(tmp_path, lambda _port: noise)
    assert not any(received)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4")
    lines = [line for line in Path(proxy.settings.log_path).read_bytes().splitlines() if line]
    assert len(parse_log(b"\n".join(lines))) == len(lines) <= 1


def test_a_head_past_its_limit_is_refused_without_reaching_the_upstream(tmp_path: Path) -> None:
    def make(port: int) -> bytes:
        padding = "X-Pad: " + "a" * (MAX_HEAD_BYTES + 10)
        return f"GET http://localhost:{port}/ HTTP/1.1\r\n{AUTH}\r\n{padding}\r\n\r\n".encode()

    _answer, received, proxy, _ = _run(tmp_path, make)
    assert not any(received)
    _check_log(proxy, made_attempt=True)


@pytest.mark.parametrize("body", [b"", b"hello"])
def test_an_allowed_request_goes_up_once_with_its_body(tmp_path: Path, body: bytes) -> None:
    def make(port: int) -> bytes:
        head = f"POST http://localhost:{port}/p HTTP/1.1\r\n{AUTH}\r\nHost: other.example\r\n"
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body + b"trailing"

    answer, received, proxy, port = _run(tmp_path, make)
    assert answer.endswith(b"ok")
    _lines, rest = _forwarded_request(received[0], port)
    assert rest == body
    assert _check_log(proxy, made_attempt=True)[0]["decision"] == "allow"


@pytest.mark.parametrize("method", ["A" * 400, "GE\x00T", "G\x7fT"])
def test_a_method_that_is_not_a_token_is_refused_and_logged_readably(
    tmp_path: Path, method: str
) -> None:
    def make(port: int) -> bytes:
        return f"{method} http://localhost:{port}/ HTTP/1.1\r\n{AUTH}\r\n\r\n".encode("latin-1")

    answer, received, proxy, _ = _run(tmp_path, make)
    assert answer.startswith(b"HTTP/1.1 400") and not any(received)
    assert _check_log(proxy, made_attempt=True)[0]["rule"] == "bad_request"


@pytest.mark.parametrize(
    "line",
    [
        # A line break after the version: the upstream would read the client's Host first
        # (no space in it, so that the line still splits in three).
        "GET http://localhost:{port}/ HTTP/1.1\nHost:evil.example",
        "GET http://localhost:{port}/ HTTP/1.1\rHost:evil.example",
        # A line break in the path (no space, so the line still splits in three).
        "GET http://localhost:{port}/a\nHost:evil.example HTTP/1.1",
        "GET http://localhost:{port}/a\rHost:evil.example HTTP/1.1",
        # Other control bytes and non-ASCII in the path.
        "GET http://localhost:{port}/a\tb HTTP/1.1",
        "GET http://localhost:{port}/a\x00b HTTP/1.1",
        "GET http://localhost:{port}/a\x7fb HTTP/1.1",
        "GET http://localhost:{port}/a\xffb HTTP/1.1",
        # A version that is not exactly HTTP/1.0 or HTTP/1.1.
        "GET http://localhost:{port}/ HTTP/1.2",
        "GET http://localhost:{port}/ HTTP/1.10",
        "GET http://localhost:{port}/ HTTP/1.",
        "GET http://localhost:{port}/ HTTP/1.1\x0b",
    ],
)
def test_a_request_line_with_a_control_byte_or_an_unknown_version_is_refused_and_not_forwarded(
    tmp_path: Path, line: str
) -> None:
    def make(port: int) -> bytes:
        return (line.format(port=port) + f"\r\n{AUTH}\r\n\r\n").encode("latin-1")

    answer, received, proxy, _ = _run(tmp_path, make)
    assert answer.startswith(b"HTTP/1.1 400") and not any(received), (answer, received)
    assert _check_log(proxy, made_attempt=True)[0]["rule"] == "bad_request"
