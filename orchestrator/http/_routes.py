"""The resource-style REST routes: each is one tool operation, its arguments gathered from the
path, the query string and (for some) a JSON object body. A table, so the handlers and the
OpenAPI document are made from the same facts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from orchestrator.errors import InvalidArgumentError
from orchestrator.tools import TOOLS, Operation

# The task scope a call runs for, within the tenant its API key names (optional).
TASK_HEADER = "x-sandhold-task"

# A query value that looks like an integer is passed as one to an integer argument; anything
# else is passed as the string it is, and the tool refuses it like any other wrong type. ASCII
# digits only (``str.isdigit`` and ``int`` take "²" and "١٢" too), and no more of them than any
# bound of ours needs (cursors stop at 2**62, 19 digits).
_INTEGER = re.compile(r"-?[0-9]{1,19}", re.ASCII)


def query_integer(value: str) -> int | None:
    """``value`` as an integer if it is one, strictly (see ``_INTEGER``); else None."""
    return int(value) if _INTEGER.fullmatch(value) else None


@dataclass(frozen=True)
class RestRoute:
    method: str
    path: str
    tool: str
    operation: str
    summary: str
    query: tuple[str, ...] = ()
    body: bool = False
    # Arguments of the operation this route does not offer (they belong to another route).
    omit: tuple[str, ...] = ()
    # The query arguments that are integers. Read from the operation's JSON schema once, here:
    # made per request, the schema was half the cost of a REST execute (~0.5 ms).
    query_integers: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        integers = integer_arguments(self.operation_spec) if self.query else frozenset()
        object.__setattr__(self, "query_integers", integers & frozenset(self.query))

    @property
    def operation_spec(self) -> Operation:
        return TOOLS[self.tool].operations[self.operation]

    @cached_property
    def path_params(self) -> tuple[str, ...]:
        return tuple(re.findall(r"{(\w+)}", self.path))

    @cached_property
    def fixed(self) -> frozenset[str]:
        """Arguments the route sets itself; a body may not give them."""
        return frozenset({"operation", *self.path_params, *self.omit})

    def arguments(
        self, path: dict[str, Any], query: dict[str, str], body: object | None
    ) -> dict[str, Any]:
        """The tool arguments of one request to this route."""
        arguments: dict[str, Any] = {}
        if self.body:
            if not isinstance(body, dict):
                raise InvalidArgumentError("the request body must be a JSON object")
            taken = sorted(self.fixed & body.keys())
            if taken:
                raise InvalidArgumentError(f"not a body field of this route: {', '.join(taken)}")
            arguments.update(body)
        for name in self.query:
            if name in query:
                value = query[name]
                number = query_integer(value) if name in self.query_integers else None
                arguments[name] = value if number is None else number
        arguments.update({name: path[name] for name in self.path_params})
        arguments["operation"] = self.operation
        return arguments


def integer_arguments(operation: Operation) -> frozenset[str]:
    properties = operation.args.model_json_schema().get("properties", {})
    return frozenset(
        name
        for name, prop in properties.items()
        if prop.get("type") == "integer"
        or any(option.get("type") == "integer" for option in prop.get("anyOf", ()))
    )


_READ_CURSORS = ("since_seq", "since_offset", "max_bytes", "max_output_chars")

REST_ROUTES: tuple[RestRoute, ...] = (
    RestRoute("GET", "/v1/sessions", "python_repl", "list_sessions", "List your sessions"),
    RestRoute(
        "POST",
        "/v1/sessions",
        "python_repl",
        "execute",
        "Create a session by running code in a new one",
        body=True,
        omit=("session_id",),
    ),
    RestRoute(
        "DELETE",
        "/v1/sessions/{session_id}",
        "python_repl",
        "destroy",
        "End a session and remove its container",
    ),
    RestRoute(
        "POST",
        "/v1/sessions/{session_id}/execute",
        "python_repl",
        "execute",
        "Run Python code in a session",
        body=True,
        omit=("policy", "session_env"),
    ),
    RestRoute(
        "POST",
        "/v1/sessions/{session_id}/shell",
        "terminal",
        "run",
        "Run a command in the session's persistent shell",
        body=True,
        omit=("policy", "session_env"),
    ),
    RestRoute(
        "GET",
        "/v1/sessions/{session_id}/history",
        "python_repl",
        "history",
        "Code run in a session",
    ),
    RestRoute(
        "GET",
        "/v1/processes",
        "process",
        "list",
        "List background processes (all your sessions', or one session's)",
        query=("session_id",),
    ),
    RestRoute(
        "GET",
        "/v1/terminals/{terminal_id}",
        "terminal",
        "read",
        "A terminal's output after a cursor, without waiting",
        query=_READ_CURSORS,
    ),
)

# The server-sent events route: not a table row, its answer is a stream (see ``_events``).
EVENTS_PATH = "/v1/terminals/{terminal_id}/events"
