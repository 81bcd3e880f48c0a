"""The HTTP server's limits as pure logic, on a fake clock: token budgets, which connections go
(idle deadlines, the longest idle at capacity, an address past its share), and the log filter
that says a repeated message once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from orchestrator.errors import InvalidArgumentError
from orchestrator.http import HttpLimitsConfig, RateLimitedLog
from orchestrator.http._connections import ConnectionTable, Refusal, Room
from orchestrator.http._limits import Budgets


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Transport(asyncio.BaseTransport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


LIMITS = HttpLimitsConfig(
    max_connections=3, max_connections_per_client=2, header_timeout=10, keep_alive_timeout=5
)


def table_with(clock: Clock, *clients: str) -> tuple[ConnectionTable, list[Transport]]:
    table = ConnectionTable(LIMITS, clock)
    transports = []
    for client in clients:
        connection = table.admit(client)
        assert not isinstance(connection, Refusal)
        transports.append(Transport())
        table.attach(connection, transports[-1])
        clock.now += 1
    return table, transports


def test_a_budget_refuses_past_its_capacity_and_refills_with_time() -> None:
    clock = Clock()
    budgets: Budgets[str] = Budgets(3, 0.5, clock=clock)
    assert [budgets.spend("a") for _ in range(4)] == [True, True, True, False]
    assert budgets.spend("b")  # another key has its own
    assert budgets.retry_after("a") == pytest.approx(2.0)
    clock.now += 2
    assert budgets.spend("a") and not budgets.spend("a")


def test_a_budget_forgets_the_least_recently_used_key_past_its_size() -> None:
    budgets: Budgets[str] = Budgets(1, 0.001, max_keys=2, clock=Clock())
    assert budgets.spend("a") and budgets.spend("b") and budgets.spend("c")
    assert budgets.spend("a")  # forgotten, so full again
    assert not budgets.spend("c")


def test_an_address_past_its_share_is_refused_and_others_are_not() -> None:
    clock = Clock()
    table, _ = table_with(clock, "10.0.0.1", "10.0.0.1")
    assert table.admit("10.0.0.1") is Refusal.CLIENT_SHARE
    assert not isinstance(table.admit("10.0.0.2"), Refusal)
    assert table.statistics()["refused"] == 1


def test_at_capacity_the_longest_idle_connection_makes_room() -> None:
    clock = Clock()
    table, transports = table_with(clock, "a", "b", "c")
    first = table.idle()[0]
    table.note(first, busy=True)  # in a request: never evicted
    assert table.make_room() is Room.MADE
    assert [t.closed for t in transports] == [False, True, False]
    assert table.make_room() is Room.FREE
    assert len(table) == 2


def test_at_capacity_with_every_connection_in_a_request_nothing_is_evicted() -> None:
    clock = Clock()
    table, transports = table_with(clock, "a", "b", "c")
    for connection in table.idle():
        table.note(connection, busy=True)
    assert table.make_room() is Room.NONE
    assert not any(t.closed for t in transports)


def test_an_idle_connection_goes_at_keep_alive_and_a_trickled_head_at_header_timeout() -> None:
    clock = Clock()
    table, transports = table_with(clock, "silent", "trickling")
    trickling = table.idle()[1]
    trickling.partial = True
    clock.now += LIMITS.keep_alive_timeout
    assert table.expire() == 1
    assert [t.closed for t in transports] == [True, False]
    clock.now += LIMITS.header_timeout - LIMITS.keep_alive_timeout
    assert table.expire() == 1
    assert transports[1].closed


def test_a_connection_in_a_request_has_no_deadline_and_a_new_one_once_it_ends() -> None:
    clock = Clock()
    table, transports = table_with(clock, "a")
    connection = table.idle()[0]
    table.note(connection, busy=True)
    clock.now += 3600
    assert table.expire() == 0
    table.note(connection, busy=False)
    clock.now += LIMITS.keep_alive_timeout - 1
    assert table.expire() == 0 and not transports[0].closed


def test_released_connections_free_their_share_once() -> None:
    clock = Clock()
    table, _ = table_with(clock, "a", "a")
    connection = table.idle()[0]
    released = []
    table.on_release = lambda: released.append(1)
    table.release(connection)
    table.release(connection)
    assert released == [1] and len(table) == 1
    assert not isinstance(table.admit("a"), Refusal)


def test_running_out_of_descriptors_lowers_the_capacity_and_evicts_idle_ones() -> None:
    clock = Clock()
    limits = HttpLimitsConfig(max_connections=200, max_connections_per_client=200)
    table = ConnectionTable(limits, clock)
    for _ in range(100):
        connection = table.admit("a")
        assert not isinstance(connection, Refusal)
        table.attach(connection, Transport())
    table.shrink()
    assert table.capacity == 36 and len(table) == 36


def test_limits_must_be_positive_and_a_share_within_the_whole() -> None:
    with pytest.raises(InvalidArgumentError):
        HttpLimitsConfig(header_timeout=0)
    with pytest.raises(InvalidArgumentError):
        HttpLimitsConfig(max_connections=2, max_connections_per_client=3)


def record(message: str, *args: object, name: str = "x") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, None)


def test_a_repeated_message_is_written_to_its_budget_then_says_how_many_were_left_out() -> None:
    clock = Clock()
    limiter = RateLimitedLog(burst=3, per_second=1.0, clock=clock)
    passed = [limiter.filter(record("refused %s", n)) for n in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert limiter.filter(record("another message"))  # its own budget
    clock.now += 1
    summary = record("refused %s", 10)
    assert limiter.filter(summary)
    assert summary.getMessage() == "refused 10 (7 more like this were not logged)"


def test_access_lines_are_limited_per_status() -> None:
    limiter = RateLimitedLog(burst=1, per_second=0.001, clock=Clock())
    line = '%s - "%s %s HTTP/%s" %d'
    access = "uvicorn.access"
    assert limiter.filter(record(line, "a", "GET", "/", "1.1", 401, name=access))
    assert not limiter.filter(record(line, "a", "GET", "/", "1.1", 401, name=access))
    assert limiter.filter(record(line, "a", "GET", "/", "1.1", 200, name=access))
