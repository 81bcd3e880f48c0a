"""The tenant egress meter's bookkeeping with a fake clock, and the proxy totals' parser."""

from __future__ import annotations

from orchestrator._core.egress_meter import EGRESS_WINDOW_S, MIB, EgressMeter
from orchestrator.backend.network_log import EgressCounters, parse_counters


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_only_what_grew_since_the_last_read_counts_and_sums_per_tenant() -> None:
    meter = EgressMeter(clock=Clock())
    first = meter.observe("s1", "a", EgressCounters(10, MIB, {"allowlist": 1}))
    again = meter.observe("s1", "a", EgressCounters(20, MIB, {"allowlist": 3}))
    meter.observe("s2", "a", EgressCounters(0, MIB, {}))
    assert (first.bytes_received, first.refused) == (MIB, {"allowlist": 1})
    assert (again.bytes_sent, again.bytes_received, again.refused) == (10, 0, {"allowlist": 2})
    assert meter.used("a") == 2 * MIB + 20
    assert meter.over("a", 2) and not meter.over("a", 3) and not meter.over("a", None)


def test_the_window_turning_frees_a_tenant() -> None:
    clock = Clock()
    meter = EgressMeter(clock=clock)
    meter.observe("s1", "a", EgressCounters(0, 5 * MIB, {}))
    assert meter.over("a", 1)
    clock.now = EGRESS_WINDOW_S + 1
    assert not meter.over("a", 1)
    meter.observe("s1", "a", EgressCounters(0, 6 * MIB, {}))
    assert meter.used("a") == MIB


def test_totals_that_shrink_are_taken_whole_not_as_a_negative_delta() -> None:
    meter = EgressMeter(clock=Clock())
    meter.observe("s1", "a", EgressCounters(0, 5 * MIB, {}))
    delta = meter.observe("s1", "a", EgressCounters(0, 1, {}))
    assert delta.bytes_received == 1


def test_proxy_totals_that_are_not_the_proxys_read_as_none() -> None:
    good = b'{"bytes_sent":1,"bytes_received":2,"refused":{"allowlist":3}}\n'
    assert parse_counters(good) == EgressCounters(1, 2, {"allowlist": 3})
    assert parse_counters(b"") == EgressCounters()
    for bad in (
        b"[]",
        b"not json",
        b'{"bytes_sent":-1,"bytes_received":2,"refused":{}}',
        b'{"bytes_sent":1.5,"bytes_received":2,"refused":{}}',
        b'{"bytes_sent":1,"bytes_received":2,"refused":{"x":true}}',
        b'{"bytes_sent":1,"bytes_received":2,"refused":{},"extra":0}',
        b'{"bytes_sent":1,"bytes_received":2,"refused":{"' + b"r" * 65 + b'":1}}',
    ):
        assert parse_counters(bad) is None, bad
