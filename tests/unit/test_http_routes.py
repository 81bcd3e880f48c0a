"""The REST shortcut routes' arguments: gathered from the path, the query and the body, with a
query value passed as an integer only to an integer argument, and only when it is one."""

from __future__ import annotations

import pytest

from orchestrator.errors import InvalidArgumentError
from orchestrator.http._routes import REST_ROUTES, RestRoute


def route(method: str, path: str) -> RestRoute:
    return next(r for r in REST_ROUTES if r.method == method and r.path == path)


READ = route("GET", "/v1/terminals/{terminal_id}")
PROCESSES = route("GET", "/v1/processes")
EXECUTE = route("POST", "/v1/sessions/{session_id}/execute")


def test_an_integer_query_value_reaches_an_integer_argument_as_an_integer() -> None:
    query = {"since_offset": "10", "max_bytes": "-1", "ignored": "3"}
    arguments = READ.arguments({"terminal_id": "t1"}, query, None)
    assert arguments == {
        "since_offset": 10,
        "max_bytes": -1,
        "terminal_id": "t1",
        "operation": "read",
    }


@pytest.mark.parametrize("value", ["ten", "1.5", "²", "١٢", "1" * 20, ""])
def test_anything_else_is_passed_as_the_string_it_is(value: str) -> None:
    arguments = READ.arguments({"terminal_id": "t1"}, {"since_offset": value}, None)
    assert arguments["since_offset"] == value


def test_a_string_argument_keeps_digits_as_a_string() -> None:
    arguments = PROCESSES.arguments({}, {"session_id": "123"}, None)
    assert arguments == {"session_id": "123", "operation": "list"}


def test_routes_without_a_query_read_no_integers_and_take_their_body() -> None:
    assert EXECUTE.query_integers == frozenset()
    arguments = EXECUTE.arguments({"session_id": "s1"}, {"since_offset": "1"}, {"code": "1+1"})
    assert arguments == {"code": "1+1", "session_id": "s1", "operation": "execute"}


def test_a_body_may_not_give_what_the_route_sets() -> None:
    with pytest.raises(InvalidArgumentError, match="session_id"):
        EXECUTE.arguments({"session_id": "s1"}, {}, {"code": "1", "session_id": "other"})
    with pytest.raises(InvalidArgumentError, match="JSON object"):
        EXECUTE.arguments({"session_id": "s1"}, {}, ["not", "an", "object"])


def test_a_new_sessions_env_goes_only_to_the_route_that_creates_one() -> None:
    create = route("POST", "/v1/sessions")
    body = {"code": "1", "session_env": {"A": "1"}}
    assert create.arguments({}, {}, body)["session_env"] == {"A": "1"}
    shell = route("POST", "/v1/sessions/{session_id}/shell")
    assert shell.arguments({"session_id": "s1"}, {}, {"command": "true", "env": {"A": "1"}})[
        "env"
    ] == {"A": "1"}
    for existing in (EXECUTE, shell):
        with pytest.raises(InvalidArgumentError, match="session_env"):
            existing.arguments({"session_id": "s1"}, {}, {"session_env": {"A": "1"}})
