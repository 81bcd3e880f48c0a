"""The client side of ``sandhold serve`` that its three clients share (``orchestrator.client``):
how long an answer is waited for, how a URL is checked and found, what a client makes of an
answer that is not the tool contract, and how server-sent events are read."""

from __future__ import annotations

import pytest

from orchestrator.client import (
    ANSWER_MARGIN,
    ANSWER_TIMEOUT,
    MAX_TIMEOUT_S,
    Event,
    EventDecoder,
    answer_timeout,
    checked_url,
    failure,
    tool_result,
    url_from_env,
)
from orchestrator.errors import InvalidArgumentError


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"timeout_s": 5},
        {"timeout_s": 0},
        {"timeout_s": -3},
        {"timeout_s": True},
        {"timeout_s": "600"},
        None,
        ["timeout_s"],
    ],
)
def test_a_call_naming_no_longer_timeout_waits_the_default(arguments: object) -> None:
    assert answer_timeout(arguments) == ANSWER_TIMEOUT


def test_a_longer_timeout_waits_that_and_the_margin_up_to_the_cap() -> None:
    assert answer_timeout({"timeout_s": 1000}) == 1000 + ANSWER_MARGIN
    assert answer_timeout({"timeout_s": 10 * MAX_TIMEOUT_S}) == MAX_TIMEOUT_S + ANSWER_MARGIN


@pytest.mark.parametrize("url", ["ftp://host", "host:8080", "http://", "", "unix:///x.sock"])
def test_a_url_that_is_not_http_is_refused_naming_its_option(url: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        checked_url(url, name="--connect")
    assert caught.value.code == "invalid_argument"
    assert str(caught.value).startswith("--connect must be http(s)://host:port")


def test_a_url_loses_its_trailing_slash() -> None:
    assert checked_url("https://example.org:8443/sandhold/") == "https://example.org:8443/sandhold"


def test_the_url_variable_wins_and_the_old_one_is_read_with_a_warning() -> None:
    warnings: list[str] = []
    both = {"SANDHOLD_URL": "http://a", "SANDHOLD_SERVER": "http://b"}
    assert url_from_env(warnings.append, both) == "http://a"
    assert url_from_env(warnings.append, {}) is None
    assert warnings == []
    assert url_from_env(warnings.append, {"SANDHOLD_SERVER": "http://b"}) == "http://b"
    assert warnings == ["SANDHOLD_SERVER is deprecated; set SANDHOLD_URL instead"]


def test_a_failure_made_by_the_client_is_the_tool_contract() -> None:
    made = failure({"operation": "execute"}, "backend_unavailable", "cannot reach")
    assert made == {
        "success": False,
        "operation": "execute",
        "error_type": "backend_unavailable",
        "error_message": "cannot reach",
    }
    assert failure({"operation": 3}, "internal", "x")["operation"] is None
    assert tool_result(made) is made
    assert tool_result({"result": 1}) is None
    assert tool_result([made]) is None


def test_events_are_read_with_their_names_and_joined_data_lines() -> None:
    decoder = EventDecoder()
    lines = [": keep-alive", "event: stdout", 'data: {"text":', "data:  1}", "", "data: x", "\r\n"]
    events = [event for line in lines if (event := decoder.feed(line)) is not None]
    assert events == [Event("stdout", '{"text":\n 1}'), Event("message", "x")]


def test_an_unterminated_event_is_only_given_when_asked_for() -> None:
    decoder = EventDecoder()
    assert decoder.feed("event: result") is None
    assert decoder.feed("data: 1") is None
    assert decoder.end() == Event("result", "1")
    assert decoder.end() is None


def test_an_event_past_the_cap_is_refused() -> None:
    decoder = EventDecoder(max_bytes=8)
    decoder.feed("data: 12345")
    with pytest.raises(ValueError, match="larger than 8 bytes"):
        decoder.feed("data: 6789")
