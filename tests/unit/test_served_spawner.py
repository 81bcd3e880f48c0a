"""The host side of the session's spawner (``session/served_spawner``) against a scripted stream:
what the spawner says is matched by request id and pid, anything else is dropped or ends that
spawner, and a process that ends before its starter runs again is still handed over whole."""

from __future__ import annotations

import base64
import json
from typing import Any

import anyio
import pytest

from orchestrator.backend.base import STDOUT, ExecResult, ExecSpec
from orchestrator.errors import InvalidArgumentError, ProcessCrashedError
from orchestrator.session.served_spawner import MAX_LINE_BYTES, ServedSpawner, SpawnedStream

pytestmark = pytest.mark.anyio

WAIT = 10.0


class ScriptedStream:
    """An exec stream whose output the test writes, and whose input it reads."""

    exec_id = "scripted"

    def __init__(self) -> None:
        self.out_send, self.out_receive = anyio.create_memory_object_stream[bytes](100)
        self.sent_send, self.sent_receive = anyio.create_memory_object_stream[bytes](100)
        self.closed = False

    async def send(self, data: bytes) -> None:
        await self.sent_send.send(data)

    async def send_eof(self) -> None:
        pass

    async def receive(self) -> tuple[int, bytes] | None:
        try:
            return STDOUT, await self.out_receive.receive()
        except anyio.EndOfStream:
            return None

    async def aclose(self) -> None:
        self.closed = True
        self.out_send.close()

    async def request(self) -> dict[str, Any]:
        """The next request line the host sent."""
        decoded: dict[str, Any] = json.loads(await self.sent_receive.receive())
        return decoded

    async def say(self, *lines: dict[str, Any] | bytes) -> None:
        """Lines from the 'spawner', in one chunk."""
        raw = [line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines]
        await self.out_send.send(b"\n".join(raw) + b"\n")


class ScriptedBackend:
    def __init__(self) -> None:
        self.streams: list[ScriptedStream] = []
        self.killed: list[list[str]] = []

    async def open_exec(self, container_id: str, spec: ExecSpec) -> ScriptedStream:
        stream = ScriptedStream()
        self.streams.append(stream)
        return stream

    async def run(self, container_id: str, spec: ExecSpec, **_: Any) -> ExecResult:
        self.killed.append(list(spec.argv))
        return ExecResult(exit_code=0, stdout=b"", stderr=b"")


async def start(spawner: ServedSpawner, tg: Any, slot: list[SpawnedStream | BaseException]) -> None:
    try:
        slot.append(await spawner.spawn(tg, ["bash", "-c", "x"], env={}, cwd="/w", pty=None))
    except Exception as exc:
        slot.append(exc)


def out(pid: int, data: bytes) -> dict[str, Any]:
    return {"ev": "out", "pid": pid, "data": base64.b64encode(data).decode()}


async def drain(stream: SpawnedStream) -> bytes:
    got = b""
    while (chunk := await stream.receive()) is not None:
        got += chunk[1]
    return got


async def test_a_process_that_ends_before_its_starter_runs_is_handed_over_whole() -> None:
    backend = ScriptedBackend()
    spawner = ServedSpawner(backend, "c")  # type: ignore[arg-type]
    slot: list[SpawnedStream | BaseException] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, spawner, tg, slot)
            await anyio.wait_all_tasks_blocked()
            request = await backend.streams[0].request()
            assert request["op"] == "start" and request["argv"] == ["bash", "-c", "x"]
            # The reply, the output and the exit all in one chunk, dispatched before the
            # starter resumes.
            await backend.streams[0].say(
                {"id": request["id"], "ok": True, "pid": 42},
                out(42, b"hello\n"),
                {"ev": "exit", "pid": 42, "code": 3},
            )
            await anyio.wait_all_tasks_blocked()
            (process,) = slot
            assert isinstance(process, SpawnedStream)
            assert await drain(process) == b"hello\n"
            assert process.pid == 42 and process.exit_code == 3
            await spawner.aclose()


async def test_lines_for_no_request_and_no_process_are_dropped() -> None:
    backend = ScriptedBackend()
    spawner = ServedSpawner(backend, "c")  # type: ignore[arg-type]
    slot: list[SpawnedStream | BaseException] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, spawner, tg, slot)
            await anyio.wait_all_tasks_blocked()
            request = await backend.streams[0].request()
            await backend.streams[0].say(
                {"id": "not-asked", "ok": True, "pid": 7},  # a forged reply
                {"ev": "exit", "pid": 7, "code": 0},  # the exit of nothing started
                out(8, b"nobody's"),
                {"id": request["id"], "ok": True, "pid": 9},
                out(9, b"mine"),
                {"ev": "exit", "pid": 9, "code": 0},
            )
            await anyio.wait_all_tasks_blocked()
            (process,) = slot
            assert isinstance(process, SpawnedStream)
            assert await drain(process) == b"mine"
            assert not backend.streams[0].closed  # the spawner is kept
            await spawner.aclose()


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"ev": "out", "pid": 9, "data": "%%%"}).encode(),
        json.dumps({"ev": "exit", "pid": 9, "code": 0, "extra": 1}).encode(),
        json.dumps({"ev": "exit", "pid": 9, "code": 999}).encode(),
        b"x" * (MAX_LINE_BYTES + 1),
    ],
)
async def test_a_bad_line_ends_that_spawner_and_its_processes_and_the_next_start_is_fresh(
    bad: bytes,
) -> None:
    backend = ScriptedBackend()
    spawner = ServedSpawner(backend, "c")  # type: ignore[arg-type]
    first: list[SpawnedStream | BaseException] = []
    second: list[SpawnedStream | BaseException] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, spawner, tg, first)
            await anyio.wait_all_tasks_blocked()
            request = await backend.streams[0].request()
            await backend.streams[0].say({"id": request["id"], "ok": True, "pid": 9})
            await anyio.wait_all_tasks_blocked()
            (process,) = first
            assert isinstance(process, SpawnedStream)
            await backend.streams[0].say(bad)
            assert await drain(process) == b""
            assert process.exit_code is None  # ended, with no exit code of its own
            assert backend.streams[0].closed
            assert [argv[-2:] for argv in backend.killed] == [["KILL", "9"]]  # its group
            with pytest.raises(InvalidArgumentError):
                await process.signal(15)
            tg.start_soon(start, spawner, tg, second)
            await anyio.wait_all_tasks_blocked()
            assert len(backend.streams) == 2  # a fresh spawner for the next start
            request = await backend.streams[1].request()
            await backend.streams[1].say({"id": request["id"], "ok": True, "pid": 10})
            await anyio.wait_all_tasks_blocked()
            assert isinstance(second[0], SpawnedStream) and second[0].pid == 10
            await spawner.aclose()


async def test_a_spawner_that_ends_before_answering_a_start_it_began_with_is_process_crashed() -> (
    None
):
    backend = ScriptedBackend()
    spawner = ServedSpawner(backend, "c")  # type: ignore[arg-type]
    slot: list[SpawnedStream | BaseException] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, spawner, tg, slot)
            await anyio.wait_all_tasks_blocked()
            await backend.streams[0].request()
            backend.streams[0].out_send.close()  # it died
            await anyio.wait_all_tasks_blocked()
            (error,) = slot
            assert isinstance(error, ProcessCrashedError)
            await spawner.aclose()
