"""A stand-in for a current Docker engine (29 and later) in front of the real one, so the tests
prove sandhold works with an engine that refuses old API versions without needing that engine.

It speaks HTTP/1.1 to each client, request by request, as Docker 29 does:
- ``/_ping`` and ``/version`` (with or without a version prefix) are answered here, with
  ``ApiVersion`` ``ADVERTISED`` and ``MinAPIVersion`` ``MINIMUM`` (and ``Api-Version`` headers);
- a request for ``/v1.NN/...`` below ``MINIMUM`` gets Docker's real refusal, a 400 whose message
  is ``client version 1.NN is too old. Minimum supported API version is 1.44, ...``;
- anything else is forwarded to the real engine, a versioned path rewritten to the version that
  engine speaks; once a request upgrades the connection (an attached exec) bytes flow both ways
  untouched.

Requests are never pipelined by the docker SDK or sandhold (HTTP/1.1 clients wait for each
response), so an answer made here never overtakes one the engine is still sending. Every request
line seen is kept in ``requests`` so a test can assert what reached the engine.

It listens on a unix socket (``docker_host``) and on a loopback TCP port (``tcp_host``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

ADVERTISED = "1.52"
MINIMUM = "1.44"
DEFAULT_UPSTREAM = "/var/run/docker.sock"
CHUNK = 1 << 16
MAX_HEAD = 64 * 1024
JOIN_TIMEOUT = 10.0
_VERSIONED = re.compile(rb"^/v(\d+)\.(\d+)(/.*)$")


def _version_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


class _Connection:
    """One client connection: requests parsed and answered or forwarded, until an upgrade."""

    def __init__(self, client: socket.socket, engine: CurrentEngine) -> None:
        self._client = client
        self._engine = engine
        self._upstream: socket.socket | None = None
        self._buffer = b""
        self._threads: list[threading.Thread] = []

    def run(self) -> None:
        try:
            while self._serve_one():
                pass
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for sock in (self._client, self._upstream):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _recv_until(self, marker: bytes) -> bool:
        while marker not in self._buffer:
            if len(self._buffer) > MAX_HEAD:
                return False
            data = self._client.recv(CHUNK)
            if not data:
                return False
            self._buffer += data
        return True

    def _take(self, size: int) -> bytes:
        while len(self._buffer) < size:
            data = self._client.recv(CHUNK)
            if not data:
                raise OSError("client closed mid-body")
            self._buffer += data
        taken, self._buffer = self._buffer[:size], self._buffer[size:]
        return taken

    def _serve_one(self) -> bool:
        if not self._recv_until(b"\r\n\r\n"):
            return False
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        method, target, protocol = lines[0].split(b" ", 2)
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in lines[1:])
        }
        body = self._body(headers)
        self._engine.requests.append(f"{method.decode()} {target.decode()}")
        path, _, query = target.partition(b"?")
        versioned = _VERSIONED.match(path)
        if versioned:
            asked = f"{int(versioned.group(1))}.{int(versioned.group(2))}"
            if _version_tuple(asked) < _version_tuple(MINIMUM):
                self._refuse_old(asked)
                return True
            path = versioned.group(3)
        if path in (b"/_ping", b"/version"):
            self._answer_here(method, path)
            return True
        real = f"/v{self._engine.upstream_version}".encode() + path if versioned else path
        if query:
            real += b"?" + query
        lines[0] = b" ".join((method, real, protocol))
        return self._forward(b"\r\n".join(lines) + b"\r\n\r\n" + body, headers)

    def _body(self, headers: dict[bytes, bytes]) -> bytes:
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while True:
                if not self._recv_until(b"\r\n"):
                    raise OSError("bad chunk")
                size_line, _, self._buffer = self._buffer.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                chunk = self._take(size + 2)
                body += size_line + b"\r\n" + chunk
                if size == 0:
                    return body
        return self._take(int(headers.get(b"content-length", b"0")))

    def _respond(self, status: str, payload: dict[str, object], method: bytes) -> None:
        body = json.dumps(payload).encode()
        head = (
            f"HTTP/1.1 {status}\r\nApi-Version: {ADVERTISED}\r\nContent-Type: application/json\r\n"
            f"Docker-Experimental: false\r\nOstype: linux\r\nServer: Docker/29.0.0 (linux)\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self._client.sendall(head if method == b"HEAD" else head + body)

    def _refuse_old(self, asked: str) -> None:
        message = (
            f"client version {asked} is too old. Minimum supported API version is {MINIMUM}, "
            "please upgrade your client to a newer version"
        )
        self._respond("400 Bad Request", {"message": message}, b"GET")

    def _answer_here(self, method: bytes, path: bytes) -> None:
        if path == b"/_ping":
            body = b"OK"
            head = (
                f"HTTP/1.1 200 OK\r\nApi-Version: {ADVERTISED}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            self._client.sendall(head if method == b"HEAD" else head + body)
            return
        version = dict(self._engine.upstream_info)
        version.update({"ApiVersion": ADVERTISED, "MinAPIVersion": MINIMUM, "Version": "29.0.0"})
        self._respond("200 OK", version, method)

    def _forward(self, request: bytes, headers: dict[bytes, bytes]) -> bool:
        if self._upstream is None:
            self._upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._upstream.connect(self._engine.upstream)
            pump = threading.Thread(target=self._pump_back, daemon=True)
            pump.start()
            self._threads.append(pump)
        self._upstream.sendall(request)
        if headers.get(b"connection", b"").lower() == b"upgrade" or b"upgrade" in headers:
            # From here the connection is the exec's raw stream: pass everything on as it is.
            if self._buffer:
                self._upstream.sendall(self._buffer)
                self._buffer = b""
            while data := self._client.recv(CHUNK):
                self._upstream.sendall(data)
            with contextlib.suppress(OSError):
                self._upstream.shutdown(socket.SHUT_WR)
            for thread in self._threads:
                thread.join(JOIN_TIMEOUT)
            return False
        return True

    def _pump_back(self) -> None:
        assert self._upstream is not None
        try:
            while data := self._upstream.recv(CHUNK):
                self._client.sendall(data)
            self._client.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class CurrentEngine:
    """The stand-in: ``with CurrentEngine() as engine:`` then point ``DOCKER_HOST`` at
    ``engine.docker_host`` (unix) or ``engine.tcp_host``."""

    def __init__(self, *, upstream: str = DEFAULT_UPSTREAM) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="sandhold-engine29-"))
        self.path = self._dir / "docker.sock"
        self.upstream = upstream
        self.requests: list[str] = []
        self.upstream_info: dict[str, object] = {}
        self.upstream_version = ""
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()
        self.tcp_port = 0

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    @property
    def tcp_host(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    def __enter__(self) -> Self:
        self.upstream_info = self._upstream_version()
        self.upstream_version = str(self.upstream_info["ApiVersion"])
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(str(self.path))
        tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp_port = tcp.getsockname()[1]
        for listener in (unix, tcp):
            listener.listen(128)
            self._listeners.append(listener)
            thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _upstream_version(self) -> dict[str, object]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(JOIN_TIMEOUT)
            sock.connect(self.upstream)
            # HTTP/1.0: the engine answers with a plain body and closes, no chunking to undo.
            sock.sendall(b"GET /version HTTP/1.0\r\nHost: docker\r\n\r\n")
            data = b""
            while chunk := sock.recv(CHUNK):
                data += chunk
        body = data.partition(b"\r\n\r\n")[2]
        info: dict[str, object] = json.loads(body)
        return info

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            connection = _Connection(client, self)
            with self._lock:
                self._connections.append(connection)
            thread = threading.Thread(target=connection.run, daemon=True)
            thread.start()
