"""The relay: joins a new exec's stdin/stdout to a persistent REPL worker's socket.

Started as ``python3 -I /opt/sandhold/worker/relay.py PID`` by an orchestrator that re-adopts a
session whose worker outlived the orchestrator before it. The first line it writes is
``sandhold-pid <pid>``: the pid of the process at the other end of the socket as the kernel tells it
(SO_PEERCRED), not as that process says, so a signal the host sends reaches the process it talks
to; ``sandhold-pid 0`` where the kernel cannot tell (gVisor's answers with the caller's own pid).
Then bytes flow both ways unchanged until either side ends; the relay exits 0 then, and 3 if it
could not reach the worker at all.
"""

import contextlib
import os
import select
import socket
import struct
import sys
import time

SOCKET_DIR = "/tmp/.sandhold"  # noqa: S108 (a private directory on the container's own tmpfs)
# The worker binds its socket before it says it is ready; a relay that finds no socket at once
# gives it this long (a worker busy with a cell still accepts into its backlog).
CONNECT_TIMEOUT = 3.0
CHUNK = 1 << 16


def socket_path(pid: int) -> str:
    return f"{SOCKET_DIR}/repl.{pid}.sock"


def _connect(path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(sock: socket.socket) -> None:
    sock_fd = sock.fileno()
    while True:
        readable, _, _ = select.select([0, sock_fd], [], [])
        if 0 in readable:
            data = os.read(0, CHUNK)
            if not data:
                return  # the host is gone: closing our end sends the worker back to accept
            sock.sendall(data)
        if sock_fd in readable:
            data = sock.recv(CHUNK)
            if not data:
                return  # the worker is gone
            _write_all(1, data)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        sys.stderr.write("usage: relay.py PID\n")
        return 2
    try:
        sock = _connect(socket_path(int(argv[1])))
    except OSError as exc:
        sys.stderr.write(f"sandhold relay: cannot reach the worker: {exc}\n")
        return 3
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _, _ = struct.unpack("3i", creds)
    if pid == os.getpid():
        pid = 0  # gVisor names the caller, not the peer: say that the kernel cannot tell
    _write_all(1, b"sandhold-pid %d\n" % pid)
    with contextlib.suppress(OSError):
        _pump(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
