"""The host half of a served helper (``session/served_helper.py``) on the in-memory backend: one
exec for many requests, replies matched by id, every broken, lying or cancelled exchange costing
that exec only, a busy helper handing the request back, and the close. The real helper
(``worker/fileops.py --serve``) in a real container is tested in tests/docker/test_files.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from orchestrator.backend.fake import FakeBackend, FakeProcess, ProgramRun
from orchestrator.errors import (
    BackendError,
    InvalidArgumentError,
    ProcessCrashedError,
    SessionNotFoundError,
)
from orchestrator.session.files.wire import FileReply
from orchestrator.session.helper_exchange import Helper
from orchestrator.session.repl.protocol import LineBuffer
from orchestrator.session.served_helper import ServedHelper

pytestmark = pytest.mark.anyio

ARGV = ("helper", "--serve")
MAX_LINE = 4096
# Nothing here waits on a container; a second is far more than any of it takes.
STEP_TIMEOUT = 5.0

# What the scripted helper answers a request with: the lines it writes (None: write nothing).
Script = Callable[[dict[str, Any]], list[bytes] | None]


class EchoReply(FileReply):
    op: str
    n: int


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def echo(request: dict[str, Any]) -> list[bytes] | None:
    if request["op"] == "hang":
        return None
    if request["op"] == "refuse":
        failure = {"ok": False, "error_type": "invalid_argument", "error_message": "no"}
        return [line({"id": request["id"], **failure})]
    return [line({"id": request["id"], "ok": True, "op": request["op"], "n": request["n"]})]


class ScriptedHelper:
    """A served helper: reads request lines, writes what ``script`` says; keeps what it saw."""

    def __init__(self, script: Script = echo) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []

    def __call__(self, process: FakeProcess) -> ProgramRun:
        pending = b""
        while (data := (yield)) is not None:
            pending += data
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                request = json.loads(raw)
                self.requests.append(request)
                for out in self.script(request) or []:
                    process.write(out)
        return 0


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def container(backend: FakeBackend) -> str:
    return backend.add_container({"unit": "served-helper"})


@pytest.fixture
def served(backend: FakeBackend, container: str) -> ServedHelper:
    helper = Helper("test helper")
    return ServedHelper(
        backend, container, helper, max_request_bytes=MAX_LINE, max_reply_bytes=MAX_LINE
    )


async def call(served: ServedHelper, op: str = "read", n: int = 1) -> EchoReply | None:
    with anyio.fail_after(STEP_TIMEOUT):
        return await served.call(ARGV, op, {"n": n}, EchoReply, timeout=STEP_TIMEOUT)


def execs(backend: FakeBackend) -> list[FakeProcess]:
    return [p for p in backend.processes.values() if tuple(p.argv) == ARGV]


async def test_one_exec_answers_every_request_each_with_its_own_reply(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    assert await call(served, n=1) == EchoReply(op="read", n=1)
    assert await call(served, "write", n=2) == EchoReply(op="write", n=2)
    assert len(execs(backend)) == 1


async def test_the_helper_is_started_at_the_first_request_not_before(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    assert execs(backend) == [] and not served.running
    await call(served)
    assert served.running


async def test_request_ids_are_unpredictable_and_never_repeat(
    backend: FakeBackend, served: ServedHelper
) -> None:
    helper = ScriptedHelper()
    backend.program(ARGV, helper)
    for n in range(3):
        await call(served, n=n)
    ids = [request["id"] for request in helper.requests]
    assert len(set(ids)) == 3
    assert all(len(request_id) == 16 for request_id in ids)


async def test_a_line_with_another_id_is_dropped_and_the_awaited_reply_is_taken(
    backend: FakeBackend, served: ServedHelper
) -> None:
    def with_strangers(request: dict[str, Any]) -> list[bytes]:
        forged = {"ok": True, "op": "forged", "n": 666}
        return [
            line({"id": "not-yours", **forged}),
            line(forged),  # no id at all
            *(echo(request) or []),
        ]

    backend.program(ARGV, ScriptedHelper(with_strangers))
    assert await call(served, n=7) == EchoReply(op="read", n=7)
    assert await call(served, n=8) == EchoReply(op="read", n=8)
    assert len(execs(backend)) == 1


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'{"id": 1, "n": NaN}\n',
        b"x" * (MAX_LINE + 1) + b"\n",
        b"y" * (MAX_LINE + 1),  # no end of line: refused before it is whole
    ],
    ids=["not-json", "not-an-object", "nan", "over-long", "over-long-unfinished"],
)
async def test_a_garbled_line_is_an_internal_error_and_the_next_request_gets_a_fresh_helper(
    garbage: bytes, backend: FakeBackend, served: ServedHelper
) -> None:
    calls = 0

    def garbled_first(request: dict[str, Any]) -> list[bytes] | None:
        nonlocal calls
        calls += 1
        return [garbage] if calls == 1 else echo(request)

    backend.program(ARGV, ScriptedHelper(garbled_first))
    with pytest.raises(BackendError) as caught:
        await call(served)
    assert caught.value.code == "internal"
    assert not served.running
    assert await call(served, n=2) == EchoReply(op="read", n=2)
    assert len(execs(backend)) == 2


async def test_a_malformed_reply_with_the_right_id_is_an_error_and_drops_the_helper(
    backend: FakeBackend, served: ServedHelper
) -> None:
    def malformed(request: dict[str, Any]) -> list[bytes]:
        return [line({"id": request["id"], "ok": True, "op": "read", "n": "1"})]

    backend.program(ARGV, ScriptedHelper(malformed))
    with pytest.raises(BackendError) as caught:
        await call(served)
    assert caught.value.code == "internal"
    assert not served.running


async def test_a_refusal_of_the_helpers_own_passes_through_and_keeps_the_helper(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    with pytest.raises(InvalidArgumentError):
        await call(served, "refuse")
    assert await call(served) == EchoReply(op="read", n=1)
    assert len(execs(backend)) == 1


async def test_a_helper_gone_while_it_waited_is_replaced_and_the_request_sent_once_more(
    backend: FakeBackend, container: str, served: ServedHelper
) -> None:
    helper = ScriptedHelper()
    backend.program(ARGV, helper)
    await call(served, n=1)
    first = execs(backend)[0]
    assert backend.kill(container, first.pid)  # it went idle, or code in the sandbox killed it
    assert await call(served, n=2) == EchoReply(op="read", n=2)
    assert len(execs(backend)) == 2
    assert [request["n"] for request in helper.requests] == [1, 2]


async def test_a_fresh_helper_that_ends_without_answering_is_an_error_not_a_loop(
    backend: FakeBackend, served: ServedHelper
) -> None:
    def dies(process: FakeProcess) -> int:
        process.write(b"Traceback: it broke\n", 2)
        return 1

    backend.program(ARGV, dies)
    with pytest.raises(ProcessCrashedError) as caught:
        await call(served)
    assert caught.value.code == "process_crashed"
    assert "Traceback: it broke" in caught.value.message
    assert len(execs(backend)) == 1


async def test_a_cancelled_call_costs_its_helper_and_the_next_call_is_answered_right(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    await call(served, n=1)
    with anyio.move_on_after(0.01) as scope:
        await served.call(ARGV, "hang", {"n": 0}, EchoReply, timeout=STEP_TIMEOUT)
    assert scope.cancelled_caught
    assert not served.running
    assert await call(served, n=2) == EchoReply(op="read", n=2)
    assert len(execs(backend)) == 2  # the one that hung, then a fresh one


async def test_a_helper_that_does_not_answer_in_time_is_an_internal_error(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    with anyio.fail_after(STEP_TIMEOUT), pytest.raises(BackendError) as caught:
        await served.call(ARGV, "hang", {"n": 0}, EchoReply, timeout=0.01)
    assert caught.value.code == "internal"
    assert not served.running


async def test_a_busy_helper_hands_the_request_back_to_its_caller(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())

    async def hang() -> None:
        await served.call(ARGV, "hang", {"n": 0}, EchoReply, timeout=STEP_TIMEOUT)

    async with anyio.create_task_group() as group:
        group.start_soon(hang)
        await anyio.wait_all_tasks_blocked()
        assert await call(served) is None
        group.cancel_scope.cancel()
    assert await call(served) == EchoReply(op="read", n=1)


async def test_a_request_longer_than_the_helper_reads_is_handed_back(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    too_long = await served.call(
        ARGV, "read", {"n": 1, "pad": "x" * MAX_LINE}, EchoReply, timeout=1
    )
    assert too_long is None
    assert execs(backend) == []


async def test_close_ends_the_stream_and_later_calls_are_session_not_found(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    await call(served)
    await served.aclose()
    await served.aclose()  # idempotent
    assert not served.running
    with pytest.raises(SessionNotFoundError):
        await call(served)
    assert len(execs(backend)) == 1


async def test_a_call_caught_by_the_close_starts_no_helper_after_it(
    backend: FakeBackend, served: ServedHelper
) -> None:
    backend.program(ARGV, ScriptedHelper())
    await call(served)

    async def close_soon() -> None:
        await anyio.wait_all_tasks_blocked()
        await served.aclose()

    async with anyio.create_task_group() as group:
        group.start_soon(close_soon)
        with pytest.raises(SessionNotFoundError):
            await served.call(ARGV, "hang", {"n": 0}, EchoReply, timeout=STEP_TIMEOUT)
    assert len(execs(backend)) == 1
    assert not served.running


def test_a_line_arriving_in_many_chunks_is_found_once_whole() -> None:
    lines = LineBuffer(1 << 20)
    chunks = [b"a" * 1000] * 100 + [b"\nb", b"c\n"]
    found = [got for chunk in chunks for got in lines.feed(chunk)]
    assert found == [b"a" * 100_000, b"bc"]
