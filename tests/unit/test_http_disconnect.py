"""``CancelOnDisconnect`` on its own, over plain ASGI callables: the body reaches the app whole and
in order, a disconnect before the response ends cancels the app, one after it changes nothing,
and the app's own exception leaves as itself (not in an exception group). Its effect on a real
call over ``sandhold serve`` is in tests/docker/test_cancelled_calls.py."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from starlette.types import Message, Receive, Scope, Send

from orchestrator.http._disconnect import CancelOnDisconnect

pytestmark = pytest.mark.anyio

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/x"}
# Every wait here is on in-memory streams; this bounds a hang, it is never reached.
TEST_TIMEOUT = 10


def client(messages: list[Message]) -> tuple[Receive, anyio.Event]:
    """A server's ``receive``: the messages, then ``http.disconnect`` once ``leave`` is set."""
    leave = anyio.Event()
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        await leave.wait()
        return {"type": "http.disconnect"}

    return receive, leave


async def respond(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})


async def test_the_body_reaches_the_app_whole_and_in_order() -> None:
    chunks = [{"type": "http.request", "body": b"%d" % i, "more_body": i < 4} for i in range(5)]
    receive, _ = client(chunks)
    got: list[bytes] = []
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        more = True
        while more:
            message = await receive()
            got.append(message["body"])
            more = message["more_body"]
        await respond(send)

    async def send(message: Message) -> None:
        sent.append(message)

    with anyio.fail_after(TEST_TIMEOUT):
        await CancelOnDisconnect(app, lambda scope: True)(SCOPE, receive, send)
    assert b"".join(got) == b"01234" and sent[-1]["body"] == b"done"


async def test_a_disconnect_before_the_response_cancels_the_app() -> None:
    receive, leave = client([{"type": "http.request", "body": b"{}", "more_body": False}])
    started, cancelled = anyio.Event(), anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    async def send(message: Message) -> None:
        raise AssertionError("a cancelled app answers nothing")

    with anyio.fail_after(TEST_TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(CancelOnDisconnect(app, lambda scope: True), SCOPE, receive, send)
            await started.wait()
            leave.set()
        assert cancelled.is_set()


async def test_a_disconnect_after_the_response_leaves_the_app_to_finish() -> None:
    receive, leave = client([{"type": "http.request", "body": b"", "more_body": False}])
    finished = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send)
        leave.set()  # a server reports the finished response as a disconnect
        await receive()  # the app sees it, as from the server
        await anyio.lowlevel.checkpoint()  # where a cancel would land
        finished.set()

    async def send(message: Message) -> None:
        pass

    with anyio.fail_after(TEST_TIMEOUT):
        await CancelOnDisconnect(app, lambda scope: True)(SCOPE, receive, send)
    assert finished.is_set()


async def test_the_apps_exception_leaves_as_itself() -> None:
    receive, _ = client([{"type": "http.request", "body": b"", "more_body": False}])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise LookupError("the app's own")

    async def send(message: Message) -> None:
        pass

    with anyio.fail_after(TEST_TIMEOUT), pytest.raises(LookupError):
        await CancelOnDisconnect(app, lambda scope: True)(SCOPE, receive, send)


async def test_a_request_it_does_not_apply_to_is_passed_through_untouched() -> None:
    receive, _ = client([])
    seen: list[Receive] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(receive)

    async def send(message: Message) -> None:
        pass

    await CancelOnDisconnect(app, lambda scope: False)(SCOPE, receive, send)
    assert seen == [receive]
