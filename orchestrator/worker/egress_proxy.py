"""The egress proxy: a session's only way off its internal network. Runs in a container of its
own (the worker image, ``python3 -I /opt/sandhold/worker/egress_proxy.py``), attached to the
session's internal network and to the upstream one; standard library only.

One proxy serves one session. Its settings come in ``SANDHOLD_EGRESS_CONFIG`` (JSON, from the
orchestrator) and never from the sandbox. Invariants:
- every request carries the session's credential (``Proxy-Authorization: Basic``), compared in
  constant time; without it the answer is 407 and nothing is resolved or connected;
- the target's name is checked against the rules, then resolved here, and the connection goes to
  the resolved address that passed the address check, so a name cannot re-resolve in between
  (rebinding); loopback, private, link-local, multicast, reserved and metadata addresses are
  refused in every mode, except ranges the operator permitted (tests' own network only);
- a ``CONNECT`` tunnel forwards nothing until the client's first TLS record is a ClientHello
  whose SNI is the ``CONNECT`` host;
- bounded: head size and time, connections at once, bytes in the proxy's life, idle time and
  life of a connection; every attempt, allowed or refused, is one line of the log (a ring of
  ``LOG_ENTRIES`` on the proxy's tmpfs, read by the orchestrator with an exec);
- the totals since the proxy started (bytes each way, refusals by rule) are written whole to
  ``stats_path`` at most every ``TICK`` seconds, and a refusal the orchestrator writes to
  ``refuse_path`` (a tenant over its egress quota) refuses every new attempt with its rule and
  closes the open connections within one ``TICK``; removing the file lifts it;
- ``final`` on the control socket (``control_path``, a Unix socket on the proxy's own tmpfs: the
  orchestrator reaches it with an exec, the sandbox cannot) ends the proxy's accounting: every
  new attempt is refused and every open connection closed from then on, and the answer is the
  totals then, so no byte moves that they do not count (a session's last read, at its end).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field

PORT = 3128
# A request head (request line and headers) larger than this is not a client we serve.
MAX_HEAD_BYTES = 16 * 1024
# A client that has not sent its head (or its ClientHello) by now is gone or stalling us.
HEAD_TIMEOUT = 10.0
# Resolving and connecting upstream: a public host that has not answered by now will not.
CONNECT_TIMEOUT = 10.0
CHUNK = 64 * 1024
# Enough history for an agent to see why its last few commands failed; the file holds at most
# twice this many lines before it is rewritten.
LOG_ENTRIES = 512
TLS_HANDSHAKE = 0x16
MAX_TLS_RECORD = 16384 + 2048
# How often the totals are written and the orchestrator's refusal is looked for: the
# orchestrator reads the totals at its own, slower, cadence, so a second of lag costs nothing.
TICK = 1.0
MAX_RULE_CHARS = 64
# The rule of every attempt after the session's last read (``final``): the session is ending.
ENDED_RULE = "session.ended"
# The control socket's one request line is a word ("final"): anything longer is not its client.
MAX_CONTROL_LINE = 64
# Its client is the orchestrator's exec, which sends at once and reads at once; one that does
# neither by now is stuck, and the session's teardown goes on without its totals anyway.
CONTROL_TIMEOUT = 5.0
# An HTTP method: a token (RFC 9110), and no real one is longer than this.
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}")
# A request target: visible ASCII only (RFC 9112 has no space, control or non-ASCII byte in
# one; clients percent-encode). A bare CR or LF let through here would reach the upstream as a
# line break of the proxy's own head, before the ``Host`` the proxy writes.
_TARGET = re.compile(r"[\x21-\x7e]+")
_VERSIONS = frozenset({"HTTP/1.0", "HTTP/1.1"})
# A header line: a token, a colon right after it, a value without control characters (a bare
# CR or LF, a NUL, a folded line or a space before the colon is refused: servers read those
# differently from one another, which is how requests are smuggled past a proxy).
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\x00-\x08\x0a-\x1f\x7f]*")
METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
# IANA's IPv6 special-purpose registry, within global unicast (everything outside it is refused
# already), written out rather than read from ``ipaddress``: its tables differ between Python
# versions (3.11 passes 6to4 as global), and the proxy runs on the image's Python.
_SPECIAL_IPV6 = tuple(
    ipaddress.IPv6Network(block)
    for block in (
        "2001::/23",  # IETF protocol assignments: Teredo (2001::/32), benchmarking, ORCHID, AMT
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4
        "2620:4f:8000::/48",  # AS112 direct delegation
        "3fff::/20",  # documentation
        "5f00::/16",  # SRv6 segment identifiers
    )
)
# Forms whose last 32 bits are an IPv4 address (the IPv4-mapped one aside, handled whole):
# IPv4-compatible (deprecated), IPv4-translated (SIIT), NAT64's well-known and local-use
# prefixes (RFC 6052, ``/96`` form).
_CARRY_LOW_32 = tuple(
    ipaddress.IPv6Network(block)
    for block in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


class Refused(Exception):
    """An attempt the rules refuse: ``rule`` names why, ``status`` is the HTTP answer."""

    def __init__(self, rule: str, status: int = 403) -> None:
        super().__init__(rule)
        self.rule = rule
        self.status = status


@dataclass
class Settings:
    token: str
    mode: str
    allow: list[str]
    permit: list[ipaddress.IPv4Network | ipaddress.IPv6Network]
    max_connections: int
    max_bytes: int
    idle_timeout: float
    max_connection: float
    log_path: str
    allow_path: str
    stats_path: str
    refuse_path: str
    control_path: str = "/tmp/egress-control.sock"  # noqa: S108

    @classmethod
    def from_json(cls, text: str) -> Settings:
        raw = json.loads(text)
        return cls(
            token=str(raw["token"]),
            mode=str(raw["mode"]),
            allow=[str(rule) for rule in raw.get("allow", [])],
            permit=[ipaddress.ip_network(c) for c in raw.get("permit_cidrs", [])],
            max_connections=int(raw["max_connections"]),
            max_bytes=int(raw["max_bytes"]),
            idle_timeout=float(raw["idle_timeout"]),
            max_connection=float(raw["max_connection"]),
            log_path=str(raw.get("log_path", "/tmp/egress-log.jsonl")),  # noqa: S108
            allow_path=str(raw.get("allow_path", "/tmp/egress-allow.json")),  # noqa: S108
            stats_path=str(raw.get("stats_path", "/tmp/egress-stats.json")),  # noqa: S108
            refuse_path=str(raw.get("refuse_path", "/tmp/egress-refuse.json")),  # noqa: S108
            control_path=str(raw.get("control_path", "/tmp/egress-control.sock")),  # noqa: S108
        )


def match_rule(mode: str, allow: list[str], host: str, port: int) -> str | None:
    """The rule that lets ``host:port`` through, or None."""
    if mode == "open":
        return "open"
    for rule in allow:
        name, _, rule_port = rule.partition(":")
        if rule_port:
            if int(rule_port) != port:
                continue
        elif port not in (80, 443):
            continue
        if name.startswith("*."):
            if host.endswith(name[1:]) and len(host) > len(name) - 1:
                return rule
        elif host == name:
            return rule
    return None


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, by the forms that carry one: IPv4-mapped,
    -compatible and -translated (``::ffff:a.b.c.d``, ``::a.b.c.d``, ``::ffff:0:a.b.c.d``),
    NAT64 (RFC 6052's ``/96`` form), 6to4 (``2002:AABB:CCDD::``) and Teredo (its server and
    its client). Whatever reaches one of these reaches the IPv4 address in it."""
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    found = [low] if any(ip in net for net in _CARRY_LOW_32) else []
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def address_refused(
    address: str, permit: list[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> bool:
    """Whether the proxy must not connect to ``address``: the metadata address always; an
    operator's permitted range never otherwise; IPv4 that is not global (or is multicast); IPv6
    outside global unicast or in any special-purpose block (IANA's registry), and IPv6 carrying
    an IPv4 address that is refused itself (judged first, so a permitted IPv6 range does not
    pass the loopback address inside it)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # the IPv4 address itself, on a dual-stack socket
            return address_refused(str(ip.ipv4_mapped), permit)
        if any(address_refused(str(v4), permit) for v4 in embedded_ipv4(ip)):
            return True
    if ip in METADATA:
        return True
    if any(ip in net for net in permit):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        return ip not in _GLOBAL_UNICAST or any(ip in net for net in _SPECIAL_IPV6)
    return not ip.is_global or ip.is_multicast


def normalize_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or len(host) > 253 or not host.isascii():
        raise Refused("bad_request", 400)
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.:")
    if not set(host) <= allowed:
        raise Refused("bad_request", 400)
    return host


def request_line(line: str, attempt: Attempt) -> tuple[str, str, str]:
    """The method, target and version of a request line, each checked whole (the version is
    forwarded as it came, the target's path too); ``Refused`` for any other line. A method that
    is not a token is logged as "?": anything else in the log line (a control byte, 16 KiB of
    it) would make the orchestrator's reader drop the entry."""
    parts = line.split(" ")
    if len(parts) != 3:
        raise Refused("bad_request", 400)
    method, target, version = parts
    if not _METHOD.fullmatch(method):
        attempt.method = "?"
        raise Refused("bad_request", 400)
    attempt.method = method
    if not _TARGET.fullmatch(target) or version not in _VERSIONS:
        raise Refused("bad_request", 400)
    return method, target, version


def split_host_port(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise Refused("bad_request", 400)
        host, rest = text[1:end], text[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not port_text:
        return normalize_host(host), default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refused("bad_request", 400)
    return normalize_host(host), int(port_text)


def client_hello_sni(record: bytes) -> str | None:
    """The server name of a TLS ClientHello record (header included), None when it has none;
    ``Refused`` when the record is not a ClientHello this parser can read whole."""
    try:
        body = record[5:]
        if record[0] != TLS_HANDSHAKE or body[0] != 1:
            raise Refused("not_tls")
        length = int.from_bytes(body[1:4], "big")
        hello = body[4 : 4 + length]
        if len(hello) < length:
            raise Refused("tls_unparsed")
        pos = 2 + 32
        pos += 1 + hello[pos]
        pos += 2 + int.from_bytes(hello[pos : pos + 2], "big")
        pos += 1 + hello[pos]
        if pos >= len(hello):
            return None
        end = pos + 2 + int.from_bytes(hello[pos : pos + 2], "big")
        pos += 2
        while pos + 4 <= end:
            kind = int.from_bytes(hello[pos : pos + 2], "big")
            size = int.from_bytes(hello[pos + 2 : pos + 4], "big")
            data = hello[pos + 4 : pos + 4 + size]
            if kind == 0:
                if data[2] != 0:
                    raise Refused("tls_unparsed")
                name_len = int.from_bytes(data[3:5], "big")
                return data[5 : 5 + name_len].decode("ascii").lower().rstrip(".")
            pos += 4 + size
        return None
    except (IndexError, UnicodeDecodeError):
        raise Refused("tls_unparsed") from None


@dataclass(eq=False)  # hashed by identity: the open connections are a set
class Attempt:
    method: str = ""
    host: str = ""
    port: int = 0
    decision: str = "deny"
    rule: str = ""
    sent: int = 0
    received: int = 0
    started: float = field(default_factory=time.time)
    # The open connection's writers (client's, upstream's), closed when a refusal arrives.
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    def entry(self, seq: int) -> dict[str, object]:
        return {
            "seq": seq,
            "time": round(self.started, 3),
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "decision": self.decision,
            "rule": self.rule,
            "bytes_sent": self.sent,
            "bytes_received": self.received,
            "duration_s": round(time.time() - self.started, 3),
        }


class Proxy:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.active = 0
        self.moved = 0
        self.seq = 0
        self.ring: deque[str] = deque(maxlen=LOG_ENTRIES)
        self.lines_in_file = 0
        self.allow_stamp: int | None = None
        self.sent = 0
        self.received = 0
        self.refused: dict[str, int] = {}
        self.refusal: str | None = None
        self.open: set[Attempt] = set()
        self.written: tuple[int, int, int] | None = None
        self.ended = False

    def refresh_refusal(self) -> None:
        """Take or lift the orchestrator's refusal (``refuse_path``: ``{"rule": ...}``); a file
        that does not read as one refuses with ``refused`` rather than lifting anything. Once
        the accounting has ended (``end``) nothing lifts it."""
        if self.ended:
            return
        try:
            with open(self.settings.refuse_path) as handle:
                rule = json.load(handle).get("rule")
        except FileNotFoundError:
            self.refusal = None
            return
        except (OSError, ValueError, AttributeError):
            rule = None
        ok = isinstance(rule, str) and 0 < len(rule) <= MAX_RULE_CHARS and rule.isprintable()
        self.refuse(rule if ok else "refused")

    def refusal_now(self) -> str | None:
        """The refusal in force (read again after an await: it may have come meanwhile)."""
        return self.refusal

    def refuse(self, rule: str) -> None:
        """Refuse every new attempt with ``rule`` and close the open connections."""
        self.refusal = rule
        for attempt in list(self.open):
            attempt.rule += f" (closed: {self.refusal})"
            for writer in attempt.writers:
                writer.close()
            self.open.discard(attempt)

    def stats_line(self) -> str:
        stats = {"bytes_sent": self.sent, "bytes_received": self.received}
        return json.dumps({**stats, "refused": self.refused}, separators=(",", ":"))

    def write_stats(self) -> None:
        state = (self.sent, self.received, sum(self.refused.values()))
        if state == self.written:
            return
        path = self.settings.stats_path
        with open(path + ".new", "w") as handle:
            handle.write(self.stats_line() + "\n")
        os.replace(path + ".new", path)
        self.written = state

    def end(self) -> str:
        """End the accounting: from now on every attempt is refused and no open connection
        moves another byte (a byte is counted before it is forwarded, and a closed attempt
        forwards nothing), so the totals returned (and written) are final."""
        self.ended = True
        self.refuse(ENDED_RULE)
        self.write_stats()
        return self.stats_line()

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The control socket: ``final`` ends the accounting and answers the totals; anything
        else is closed unanswered."""
        try:
            line = await asyncio.wait_for(reader.readline(), CONTROL_TIMEOUT)
            if line == b"final\n":
                writer.write(self.end().encode() + b"\n")
                await asyncio.wait_for(writer.drain(), CONTROL_TIMEOUT)
        except (TimeoutError, OSError, ValueError):
            pass
        finally:
            writer.close()

    async def tick(self) -> None:
        while True:
            self.refresh_refusal()
            self.write_stats()
            await asyncio.sleep(TICK)

    def refresh_rules(self) -> None:
        """Take a live allowlist the orchestrator wrote (``allow_path``, replaced whole); one
        stat per connection, so a change applies to the next connection at once. A file that
        does not read as a list of rules is ignored and the rules in force are kept."""
        try:
            stamp = os.stat(self.settings.allow_path).st_mtime_ns
        except OSError:
            return
        if stamp == self.allow_stamp:
            return
        self.allow_stamp = stamp
        try:
            with open(self.settings.allow_path) as handle:
                rules = json.load(handle)["allow"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        if isinstance(rules, list) and all(isinstance(rule, str) for rule in rules):
            self.settings.mode, self.settings.allow = "allowlist", rules

    def record(self, attempt: Attempt) -> None:
        self.seq += 1
        if attempt.decision == "deny":
            self.refused[attempt.rule] = self.refused.get(attempt.rule, 0) + 1
        line = json.dumps(attempt.entry(self.seq), separators=(",", ":"))
        self.ring.append(line)
        path = self.settings.log_path
        if self.lines_in_file >= 2 * LOG_ENTRIES:
            with open(path + ".new", "w") as handle:
                handle.write("\n".join(self.ring) + "\n")
            os.replace(path + ".new", path)
            self.lines_in_file = len(self.ring)
        else:
            with open(path, "a") as handle:
                handle.write(line + "\n")
            self.lines_in_file += 1

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attempt = Attempt()
        self.active += 1
        try:
            await self._serve(reader, writer, attempt)
        except Refused as refused:
            attempt.decision, attempt.rule = "deny", refused.rule
            await _answer(writer, refused.status, refused.rule, attempt)
        except asyncio.IncompleteReadError as ended:
            # Connected and closed without a byte: the orchestrator's readiness probe (or a
            # client that gave up) made no attempt, so there is nothing to log or count.
            if ended.partial or attempt.method:
                attempt.rule = attempt.rule or "bad_request"
            else:
                attempt.method = "-"
        except (TimeoutError, OSError, asyncio.LimitOverrunError, ValueError):
            if attempt.decision == "allow" and "(closed:" not in attempt.rule:
                attempt.rule += " (ended: connection error or timeout)"
            else:
                attempt.rule = attempt.rule or "bad_request"
        finally:
            self.active -= 1
            self.open.discard(attempt)
            if attempt.method != "-":
                self.record(attempt)
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, attempt: Attempt
    ) -> None:
        s = self.settings
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = request_line(lines[0], attempt)
        authority, framing = "", None
        if method == "CONNECT":
            attempt.host, attempt.port = split_host_port(target, 443)
        elif target.startswith("http://"):
            authority, _, path = target[7:].partition("/")
            authority = authority.rpartition("@")[2]
            attempt.host, attempt.port = split_host_port(authority, 80)
            target = "/" + path
        else:
            raise Refused("bad_request", 400)
        headers = [line for line in lines[1:] if line]
        if not all(_HEADER.fullmatch(line) for line in headers):
            raise Refused("bad_request", 400)
        if not self._authorized(headers):
            raise Refused("auth", 407)
        if self.active > s.max_connections:
            raise Refused("limit.connections", 503)
        if self.moved >= s.max_bytes:
            raise Refused("limit.bytes", 503)
        self.refresh_refusal()
        if self.refusal is not None:
            raise Refused(self.refusal, 403)
        self.refresh_rules()
        rule = match_rule(s.mode, s.allow, attempt.host, attempt.port)
        if rule is None:
            raise Refused("allowlist")
        address = await self._resolve(attempt.host, attempt.port)
        attempt.rule = rule
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            first = await asyncio.wait_for(_read_tls_record(reader), HEAD_TIMEOUT)
            sni = client_hello_sni(first)
            if sni != attempt.host and not (sni is None and _is_ip(attempt.host)):
                attempt.rule = "sni_mismatch" if sni else "sni_missing"
                attempt.decision = "deny"
                return
            prologue = first
        else:
            framing = body_framing(headers)
            prologue = plain_request_head(method, target, version, authority, headers)
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(address, attempt.port), CONNECT_TIMEOUT
        )
        refusal = self.refusal_now()
        if refusal is not None:  # came while connecting: nothing goes up
            up_writer.close()
            attempt.decision, attempt.rule = "deny", refusal
            if method == "CONNECT":
                return  # the tunnel's 200 went already: a refusal answer would be read as TLS
            raise Refused(refusal)
        attempt.decision = "allow"
        attempt.writers = [writer, up_writer]
        self.open.add(attempt)
        try:
            up_writer.write(prologue)
            attempt.sent += len(prologue)
            self.sent += len(prologue)
            self.moved += len(prologue)
            # Plain HTTP: this one request's body goes up, and nothing after it (a second
            # request on the connection would reach the checked host's address under a name
            # that was never checked); the upstream closes after its answer.
            outbound = (
                self._pipe(reader, up_writer, attempt, "sent")
                if method == "CONNECT"
                else self._pipe_body(reader, up_writer, attempt, framing)
            )
            await asyncio.wait_for(
                asyncio.gather(outbound, self._pipe(up_reader, writer, attempt, "received")),
                s.max_connection,
            )
        finally:
            up_writer.close()

    def _authorized(self, headers: list[str]) -> bool:
        for header in headers:
            name, _, value = header.partition(":")
            if name.strip().lower() != "proxy-authorization":
                continue
            scheme, _, blob = value.strip().partition(" ")
            if scheme.lower() != "basic":
                return False
            try:
                decoded = base64.b64decode(blob.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return False
            password = decoded.partition(":")[2]
            return hmac.compare_digest(password.encode(), self.settings.token.encode())
        return False

    async def _resolve(self, host: str, port: int) -> str:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=1),
                CONNECT_TIMEOUT,  # SOCK_STREAM
            )
        except (TimeoutError, OSError):
            raise Refused("dns", 502) from None
        addresses = [str(info[4][0]) for info in infos]
        for address in addresses:
            if not address_refused(address, self.settings.permit):
                return address
        raise Refused("private_address")

    def _count(self, attempt: Attempt, counter: str, size: int) -> None:
        self.moved += size
        setattr(attempt, counter, getattr(attempt, counter) + size)
        setattr(self, counter, getattr(self, counter) + size)

    async def _pipe_body(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        attempt: Attempt,
        framing: int | None,
    ) -> None:
        """The request body, framed by ``framing`` (a length, or None: chunked), and no byte
        more; a chunked body is forwarded as it came, its framing checked on the way."""
        s = self.settings

        async def forward(data: bytes) -> None:
            if attempt not in self.open:
                raise ConnectionResetError("refused")
            self._count(attempt, "sent", len(data))
            if self.moved > s.max_bytes:
                attempt.rule += " (closed: limit.bytes)"
                raise ConnectionResetError("limit.bytes")
            sink.write(data)
            await sink.drain()

        async def exactly(size: int) -> None:
            while size > 0:
                data = await asyncio.wait_for(source.read(min(size, CHUNK)), s.idle_timeout)
                if not data:
                    raise asyncio.IncompleteReadError(b"", size)
                size -= len(data)
                await forward(data)

        if framing is not None:
            await exactly(framing)
            return
        while True:
            line = await asyncio.wait_for(source.readuntil(b"\r\n"), s.idle_timeout)
            if len(line) > MAX_CHUNK_LINE:
                raise ValueError("chunk size line too long")
            size = chunk_size(line)
            await forward(line)
            if size == 0:
                break
            await exactly(size)
            end = await asyncio.wait_for(source.readexactly(2), s.idle_timeout)
            if end != b"\r\n":
                raise ValueError("a chunk not followed by CRLF")
            await forward(end)
        while True:  # trailers, up to the empty line
            line = await asyncio.wait_for(source.readuntil(b"\r\n"), s.idle_timeout)
            await forward(line)
            if line == b"\r\n":
                return

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        attempt: Attempt,
        counter: str,
    ) -> None:
        s = self.settings
        while data := await asyncio.wait_for(source.read(CHUNK), s.idle_timeout):
            if attempt not in self.open:
                raise ConnectionResetError("refused")  # closed by a refusal meanwhile
            self._count(attempt, counter, len(data))
            if self.moved > s.max_bytes:
                attempt.rule += " (closed: limit.bytes)"
                sink.close()
                raise ConnectionResetError("limit.bytes")
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()


# Headers the upstream never sees from the client: the proxy's own, the connection's (the proxy
# says ``Connection: close``), and ``Host``, which the proxy writes from the checked target.
_DROPPED = frozenset(
    {"proxy-authorization", "proxy-connection", "connection", "keep-alive", "host", "upgrade"}
)
MAX_CHUNK_LINE = 1024


def plain_request_head(
    method: str, path: str, version: str, authority: str, headers: list[str]
) -> bytes:
    """The head sent upstream for a plain HTTP request: origin-form path, the client's headers
    but those in ``_DROPPED``, ``Host`` from the checked target (a client's own ``Host`` could
    name another site on the checked address), and ``Connection: close``."""
    kept = [h for h in headers if h.split(":", 1)[0].strip().lower() not in _DROPPED]
    head = f"{method} {path} {version}\r\nHost: {authority}\r\n"
    head += "".join(h + "\r\n" for h in kept) + "Connection: close\r\n\r\n"
    return head.encode("latin-1")


def body_framing(headers: list[str]) -> int | None:
    """The request body's length (0: none), or None for a chunked body; a head whose framing
    is ambiguous (both, several lengths, another transfer coding) is refused, since the proxy
    and the upstream could read it differently (request smuggling)."""
    lengths, codings = set(), []
    for header in headers:
        name, _, value = header.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            lengths.add(value.strip())
        elif name == "transfer-encoding":
            codings.append(value.strip().lower())
    if codings:
        if lengths or codings != ["chunked"]:
            raise Refused("bad_request", 400)
        return None
    if not lengths:
        return 0
    (length,) = lengths if len(lengths) == 1 else (None,)
    if length is None or not length.isdigit() or len(length) > 15:
        raise Refused("bad_request", 400)
    return int(length)


def chunk_size(line: bytes) -> int:
    """The size on a chunk's size line (``1a;ext=1\\r\\n``); ValueError when it is not one."""
    text = line[:-2].split(b";", 1)[0].strip()
    if not text or len(text) > 15 or text.strip(b"0123456789abcdefABCDEF"):
        raise ValueError("bad chunk size")
    return int(text, 16)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _read_tls_record(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(5)
    if header[0] != TLS_HANDSHAKE:
        raise Refused("not_tls")
    length = int.from_bytes(header[3:5], "big")
    if length > MAX_TLS_RECORD:
        raise Refused("tls_unparsed")
    return header + await reader.readexactly(length)


async def _answer(writer: asyncio.StreamWriter, status: int, rule: str, attempt: Attempt) -> None:
    if writer.is_closing():
        return
    reason = {
        400: "Bad Request",
        403: "Forbidden",
        407: "Proxy Authentication Required",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }.get(status, "Forbidden")
    body = f"sandhold egress: refused {attempt.host}:{attempt.port} (rule {rule})\n".encode()
    extra = 'Proxy-Authenticate: Basic realm="sandhold"\r\n' if status == 407 else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nX-Sandhold-Egress-Rule: {rule}\r\n{extra}"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        writer.write(head.encode() + body)
        await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT)
    except (TimeoutError, OSError):
        pass


async def serve(settings: Settings) -> None:
    proxy = Proxy(settings)
    open(settings.log_path, "a").close()  # noqa: ASYNC230 (exists before any attempt)
    # Before the proxy's port opens (the orchestrator's readiness probe), so that a session's
    # end always finds it; the proxy's own user only (the orchestrator's exec runs as it).
    control = await asyncio.start_unix_server(
        proxy.control, path=settings.control_path, limit=MAX_CONTROL_LINE
    )
    os.chmod(settings.control_path, 0o600)
    # Every interface of the proxy's container: the session network's address is not known
    # inside, and the upstream side has no client that could connect (nothing routes there).
    any_address = "0.0.0.0"  # noqa: S104
    server = await asyncio.start_server(
        proxy.handle, host=any_address, port=PORT, limit=MAX_HEAD_BYTES
    )
    ticker = asyncio.create_task(proxy.tick())
    async with server, control:
        try:
            await server.serve_forever()
        finally:
            ticker.cancel()


def main() -> None:
    settings = Settings.from_json(os.environ["SANDHOLD_EGRESS_CONFIG"])
    os.environ.pop("SANDHOLD_EGRESS_CONFIG", None)
    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
