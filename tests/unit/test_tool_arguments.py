"""Arguments as agent frameworks send them (pure logic): every field of the tool's one schema,
null or at its advertised default where the operation does not use it; and every tool's input
schema through OpenAI strict-mode conversion, with the real ``openai-agents`` package."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import mcp_types as types
import pytest
from agents.mcp import MCPServerStdio, MCPUtil

from orchestrator.errors import InvalidArgumentError
from orchestrator.tools import TOOLS, Operation, Tool
from orchestrator.tools._arguments import read_arguments

OPERATIONS = [(tool, op) for tool in TOOLS.values() for op in tool.operations.values()]
IDS = [f"{tool.name}.{op.name}" for tool, op in OPERATIONS]


def sample(prop: dict[str, Any]) -> Any:
    """A value of the property's type, for a field an operation requires."""
    if "anyOf" in prop:
        return sample(next(b for b in prop["anyOf"] if b.get("type") != "null"))
    if "enum" in prop:
        return prop["enum"][0]
    kind = prop["type"]
    if kind == "array":
        return [sample(prop["items"])]
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True}[kind]


def required_arguments(operation: Operation) -> dict[str, Any]:
    schema = operation.args.model_json_schema()
    return {name: sample(schema["properties"][name]) for name in schema.get("required", [])}


def every_field(tool: Tool, operation: Operation, fill: Any = None) -> dict[str, Any]:
    """All the tool's fields, as a strict-mode model sends them: null (or ``fill(name)``) where
    the operation does not need them."""
    names = set(tool.input_schema()["properties"]) - {"operation"}
    given = {name: fill(name) if fill else None for name in names}
    return {**given, "operation": operation.name, **required_arguments(operation)}


def advertised_default(tool: Tool, name: str) -> Any:
    defaults = [d for d in tool.unset_values[name] if d is not None]
    return defaults[0] if defaults else None


@pytest.mark.parametrize(("tool", "operation"), OPERATIONS, ids=IDS)
def test_every_operation_takes_every_other_field_null(tool: Tool, operation: Operation) -> None:
    read_arguments(tool, operation, every_field(tool, operation))


@pytest.mark.parametrize(("tool", "operation"), OPERATIONS, ids=IDS)
def test_every_operation_takes_every_other_field_at_its_advertised_default(
    tool: Tool, operation: Operation
) -> None:
    arguments = every_field(tool, operation, lambda name: advertised_default(tool, name))
    read_arguments(tool, operation, arguments)


def test_the_issue_calls_are_accepted() -> None:
    repl = TOOLS["python_repl"]
    listing = {"operation": "list_sessions", "session_id": None}
    read_arguments(repl, repl.operations["list_sessions"], listing)
    execute = {"operation": "execute", "code": "1", "max_tokens": 50_000}
    assert read_arguments(repl, repl.operations["execute"], execute).model_dump()["code"] == "1"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("python_repl", {"operation": "list_sessions", "session_id": "abc"}),
        ("python_repl", {"operation": "execute", "code": "1", "max_tokens": 10}),
        ("python_repl", {"operation": "execute", "code": "1", "variable_name": "x"}),
        ("terminal", {"operation": "read", "terminal_id": "t", "confirm_dangerous": 0}),
        ("terminal", {"operation": "read", "terminal_id": "t", "yield_time_ms": 1000.0}),
        ("terminal", {"operation": "read", "terminal_id": "t", "signal": "KILL"}),
        ("python_repl", {"operation": "list_sessions", "surprise": None}),
        ("python_repl", {"operation": "execute", "code": None}),
        ("python_repl", {"operation": "inspect", "session_id": "s", "variable_name": None}),
    ],
)
def test_a_value_that_would_be_ignored_or_a_missing_one_is_refused(
    tool: str, arguments: dict[str, Any]
) -> None:
    found = TOOLS[tool]
    with pytest.raises(InvalidArgumentError):
        read_arguments(found, found.operations[arguments["operation"]], arguments)


def test_null_for_an_argument_with_a_default_is_the_default() -> None:
    repl = TOOLS["python_repl"]
    arguments = {"operation": "history_context", "session_id": "s", "max_tokens": None}
    read = read_arguments(repl, repl.operations["history_context"], arguments)
    assert read.model_dump()["max_tokens"] == 50_000


@pytest.mark.parametrize(
    "env",
    [
        {"A": "1", "B": "2"},
        ["A=1", "B=2"],
        [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        ["A=1", {"name": "B", "value": "2"}],
    ],
    ids=["map", "assignments", "pairs", "both"],
)
def test_env_is_taken_as_name_value_pairs_or_as_a_map(env: Any) -> None:
    for tool_name in ("terminal", "process"):
        tool = TOOLS[tool_name]
        arguments = {"operation": "start", "command": "true", "session_id": "s", "env": env}
        read = read_arguments(tool, tool.operations["start"], arguments)
        assert read.model_dump()["env"] == {"A": "1", "B": "2"}


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
        [{"name": "A"}],
        [{"name": "A", "value": 1}],
        ["A"],
        ["=1"],
        ["A=1", "A=2"],
    ],
)
def test_env_pairs_that_do_not_make_a_map_are_refused(env: Any) -> None:
    tool = TOOLS["terminal"]
    arguments = {"operation": "start", "command": "true", "env": env}
    with pytest.raises(InvalidArgumentError):
        read_arguments(tool, tool.operations["start"], arguments)


def _nodes(schema: Any) -> list[dict[str, Any]]:
    if isinstance(schema, list):
        return [node for item in schema for node in _nodes(item)]
    if not isinstance(schema, dict):
        return []
    return [schema, *(node for value in schema.values() for node in _nodes(value))]


@pytest.mark.parametrize("tool", TOOLS.values(), ids=list(TOOLS))
def test_the_input_schema_keeps_openai_strict_modes_rules(tool: Tool) -> None:
    """By the documented rules: no ``default``, no ``$ref``, every object closed, and every
    field but ``operation`` nullable, so a model that must send every field can send null."""
    schema = tool.input_schema()
    for node in _nodes(schema):
        assert "$ref" not in node and "default" not in node, node
        if node.get("type") == "object" or "properties" in node:
            assert node.get("additionalProperties") is False, node
    validator = jsonschema.Draft202012Validator({"type": ["null"]})
    for name, prop in schema["properties"].items():
        if name != "operation":
            assert validator.evolve(schema=prop).is_valid(None), (tool.name, name)


@pytest.mark.parametrize("tool", TOOLS.values(), ids=list(TOOLS))
def test_openai_agents_converts_every_input_schema_to_strict_mode(tool: Tool) -> None:
    listed = types.Tool(
        name=tool.name, description=tool.description, input_schema=tool.input_schema()
    )
    server = MCPServerStdio(params={"command": "sandhold", "args": ["mcp"]})  # never started
    converted = MCPUtil.to_function_tool(listed, server, convert_schemas_to_strict=True)
    assert converted.strict_json_schema is True
    strict = converted.params_json_schema
    assert set(strict["required"]) == set(strict["properties"])
    for operation in tool.operations.values():
        arguments = every_field(tool, operation)
        jsonschema.validate(arguments, copy.deepcopy(strict))
        read_arguments(tool, operation, arguments)
