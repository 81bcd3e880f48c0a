"""A unix-socket proxy in front of the real Docker engine, so a test can make the engine go away
and come back without touching the machine's dockerd (other containers run on it).

Every connection made to ``path`` is forwarded byte for byte to the engine's socket, half-closes
included (an attached exec's stdin EOF is one). ``cut()`` behaves as a daemon that died: it stops
listening first (new connections are refused, the socket file stays, as after a ``kill -9``), then
closes every open connection on both sides, so a request in flight and an attached stream both
break. ``restore()`` listens again at the same path. The engine itself, and every container on it,
never notices.

Invariants: one thread accepts, two threads pump each connection (one per direction); ``cut`` and
``close`` return only once every pump has stopped, so a test that cut the engine can rely on it.
"""

from __future__ import annotations

import contextlib
import selectors
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

DEFAULT_UPSTREAM = "/var/run/docker.sock"
CHUNK = 1 << 16
# Pumps end as soon as their sockets are shut down; this only bounds a bug, never a normal run.
JOIN_TIMEOUT = 10.0


class _Watch:
    """Set once a client has sent ``marker`` towards the engine."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.seen = threading.Event()


class _Link:
    """One client connection and its upstream twin, pumped both ways."""

    def __init__(
        self, client: socket.socket, upstream: socket.socket, watches: list[_Watch]
    ) -> None:
        self._client = client
        self._upstream = upstream
        self._watches = watches
        self._threads = [
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True),
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True),
        ]
        self._lock = threading.Lock()
        self._ended = 0

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                if source is self._client:
                    for watch in self._watches:
                        if watch.marker in data:
                            watch.seen.set()
                target.sendall(data)
            target.shutdown(socket.SHUT_WR)  # pass the half-close on
        except OSError:
            self.sever()
        finally:
            with self._lock:
                self._ended += 1
                both_done = self._ended == 2
            if both_done:
                self._client.close()
                self._upstream.close()

    def sever(self) -> None:
        """Shut both sockets down: blocked pumps wake, and the client sees its connection end."""
        for sock in (self._client, self._upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)

    @property
    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)


class EngineProxy:
    def __init__(self, *, upstream: str = DEFAULT_UPSTREAM) -> None:
        # A short private directory: a socket path must fit ``sun_path`` (108 bytes), which a
        # pytest tmp_path named after a long test does not.
        self._dir = Path(tempfile.mkdtemp(prefix="sandhold-engine-"))
        self.path = self._dir / "docker.sock"
        self.upstream = upstream
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._watches: list[_Watch] = []

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def __enter__(self) -> Self:
        self.restore()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def watch(self, marker: bytes) -> threading.Event:
        """An event set once a client sends ``marker`` to the engine (in one chunk): a test
        knows a request is in flight, without sleeping."""
        watch = _Watch(marker)
        self._watches.append(watch)
        return watch.seen

    def restore(self) -> None:
        """Listen (again) at ``path``: the engine is back."""
        if self._listener is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(128)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()

    def cut(self) -> None:
        """The engine dies: refuse new connections, then break every open one."""
        self._stop_listening()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.sever()
        for link in links:
            link.join()

    def close(self) -> None:
        self.cut()
        self._wake_r.close()
        self._wake_w.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        acceptor, self._acceptor = self._acceptor, None
        if listener is None or acceptor is None:
            return
        self._wake_w.send(b"x")
        acceptor.join(JOIN_TIMEOUT)
        self._wake_r.recv(1)
        # Closed, not unlinked: connecting to the leftover socket file is refused, as it is after
        # a daemon was killed.
        listener.close()

    def _accept(self, listener: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_r in ready:
                    return
                client, _ = listener.accept()
                self._forward(client)

    def _forward(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.upstream)
        except OSError:
            upstream.close()
            client.close()
            return
        link = _Link(client, upstream, self._watches)
        with self._lock:
            self._links = [existing for existing in self._links if existing.alive]
            self._links.append(link)
        link.start()
