"""Connecting to the engine's unix socket (``_endpoint.connect_unix``): it connects, waits while
the listen queue is full and connects once there is room, and a connect cancelled while it waits
leaves nothing behind in the event loop. (anyio's own connect_unix left a bare
``Future.set_result`` there, which a cancel in the step the socket turned writable made raise
``InvalidStateError``; the last test sets that step up, and caught it about one run in ten.)"""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest

from orchestrator.backend.docker._endpoint import connect_unix

pytestmark = pytest.mark.anyio

# Everything here is local: far less than this.
WAIT = 10.0


def full_listener(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listener that accepts nothing, and clients that fill its queue (a connect then fails
    with EAGAIN)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    fillers: list[socket.socket] = []
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            client.connect(str(path))
        except BlockingIOError:
            client.close()
            return listener, fillers
        fillers.append(client)


async def test_it_connects_and_the_stream_carries_bytes(tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    with anyio.fail_after(WAIT):
        stream = await connect_unix(str(path))
        peer, _ = await anyio.to_thread.run_sync(listener.accept)
        async with stream:
            await stream.send(b"ping")
            assert await anyio.to_thread.run_sync(peer.recv, 4) == b"ping"
    peer.close()
    listener.close()


async def test_a_full_queue_is_waited_out_and_a_cancelled_wait_leaves_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "engine.sock"
    listener, fillers = full_listener(path)
    try:
        for _ in range(20):  # cancelled while waiting, again and again
            with anyio.move_on_after(0.01):
                await connect_unix(str(path))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:
                group.start_soon(connect_unix, str(path))
                await anyio.sleep(0.1)
                # Room in the queue: the waiting connect goes through.
                accepted, _ = await anyio.to_thread.run_sync(listener.accept)
                accepted.close()
    finally:
        for client in fillers:
            client.close()
        listener.close()


async def test_a_connect_cancelled_just_as_room_comes_leaves_no_error_in_the_loop(
    tmp_path: Path,
) -> None:
    """Room in the queue (the socket turns writable) and the cancel in the same step: the loop
    then runs the writable callback after the wait was cancelled (anyio's connect_unix raised
    InvalidStateError there, reported by the test runner)."""
    path = tmp_path / "engine.sock"
    listener, fillers = full_listener(path)
    try:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:
                group.start_soon(connect_unix, str(path))
                await anyio.sleep(0.05)  # it waits for room
                accepted, _ = listener.accept()  # queued: answers at once
                group.cancel_scope.cancel()
            await anyio.sleep(0.05)  # a pass of the loop for a stray callback
        accepted.close()
    finally:
        for client in fillers:
            client.close()
        listener.close()
