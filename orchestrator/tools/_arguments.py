"""Reading one call's arguments into its operation's model. A tool advertises one schema for all
its operations, so a client may send fields of other operations: clients that fill every field
(mcp-use's LangChain adapter) or make every field required and nullable (OpenAI strict mode).

- A field the operation takes: null means unset (its default, or "missing" when required).
- A field of another operation of the tool: omitted, null or one of its advertised defaults is
  dropped; any other value is refused (``invalid_argument``), as it would be ignored otherwise.
- A key no operation of the tool takes: refused.
- A str-to-str map (``env``) also takes a list of ``NAME=value`` strings (what the schema
  advertises: strict schemas take no open map) or of ``{name, value}`` objects, the form
  advertised before; each name once.

A value equals a default only with the same type: ``1`` is not ``True`` and ``5.0`` is not ``5``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import pydantic

from orchestrator.errors import InvalidArgumentError


# What is read here of a tool and its operation (``tools._base``, which calls this module):
# protocols, so this module needs nothing of it.
class _Tool(Protocol):
    @property
    def unset_values(self) -> Mapping[str, tuple[Any, ...]]: ...


class _Operation(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def args(self) -> type[pydantic.BaseModel]: ...
    @property
    def map_fields(self) -> frozenset[str]: ...


# pydantic's own reading of a few problems is enough; more would only repeat the first.
MAX_PROBLEMS = 5


def read_arguments(
    tool: _Tool, operation: _Operation, arguments: dict[str, Any]
) -> pydantic.BaseModel:
    fields = operation.args.model_fields
    given: dict[str, Any] = {}
    for key, value in arguments.items():
        if key == "operation":
            continue
        field = fields.get(key)
        if field is None:
            if _leaves_unset(value, tool.unset_values.get(key)):
                continue
        elif value is None and field.default is not None:
            continue  # null means unset: the default, or "missing" for a required field
        elif key in operation.map_fields and isinstance(value, list):
            value = _pairs(operation.name, key, value)
        given[key] = value
    try:
        return operation.args.model_validate(given)
    except pydantic.ValidationError as exc:
        problems = "; ".join(_problem(tool, e) for e in exc.errors()[:MAX_PROBLEMS])
        raise InvalidArgumentError(f"{operation.name}: {problems}") from None


def _leaves_unset(value: Any, unset: tuple[Any, ...] | None) -> bool:
    if unset is None:
        return False
    return any(value is u or (type(value) is type(u) and value == u) for u in unset)


def _pairs(operation: str, key: str, pairs: list[Any]) -> dict[str, Any]:
    mapping: dict[str, Any] = {}
    for pair in pairs:
        if isinstance(pair, str) and "=" in pair:
            name, value = pair.split("=", 1)
        elif isinstance(pair, dict) and set(pair) == {"name", "value"}:
            name, value = pair["name"], pair["value"]
        else:
            raise InvalidArgumentError(
                f"{operation}: {key}: each item must be a NAME=value string or {{name, value}}"
            )
        if not isinstance(name, str) or not name or name in mapping:
            raise InvalidArgumentError(f"{operation}: {key}: names must be distinct, non-empty")
        mapping[name] = value
    return mapping


def _problem(tool: _Tool, error: Any) -> str:
    where = ".".join(str(p) for p in error["loc"]) or "arguments"
    if error["type"] != "extra_forbidden":
        return f"{where}: {error['msg']}"
    if error["loc"] and error["loc"][0] in tool.unset_values:
        return f"{where}: not an argument of this operation (only null or its default is taken)"
    return f"{where}: unknown argument"
