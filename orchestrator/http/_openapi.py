"""The OpenAPI 3.1 document of the HTTP API, made from the tools' argument models and the route
table, so it cannot drift from what the handlers accept."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from orchestrator.http._ops import (
    DEFAULT_AUDIT_LIMIT,
    MAX_AUDIT_LIMIT,
    OPS_AUDIT_PATH,
    OPS_POOLS_PATH,
    OPS_SESSIONS_PATH,
)
from orchestrator.http._routes import EVENTS_PATH, REST_ROUTES, RestRoute
from orchestrator.tools import TOOLS, Operation, Tool

RESULT_REF = {"$ref": "#/components/schemas/ToolResult"}

# Every failure answers the structured result too; the status says what kind of failure it is.
FAILURES: dict[str, str] = {
    "400": "invalid_argument: a malformed body or a wrong argument",
    "401": "no API key, or not a valid one",
    "403": "policy: the policy in force forbids it",
    "404": "session_not_found: unknown, or not yours (the same answer)",
    "409": "busy: the session is serving another call",
    "429": "quota_exceeded",
    "500": "internal",
    "503": "backend_unavailable: the container engine cannot serve it",
}
OK = (
    "The tool's answer. `success` is false when the work itself failed (an exception in the "
    "user's code, a timeout, a blocked import): that is an answer too, not a failed request."
)
TOO_LARGE = "the request body is larger than the server accepts"

TOOL_RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The structured result of a tool call; `success` comes first.",
    "required": ["success"],
    "properties": {
        "success": {"type": "boolean"},
        "operation": {"description": "The operation, as given."},
        "error_type": {"type": ["string", "null"], "description": "Stable error code."},
        "error_message": {"type": ["string", "null"]},
    },
    "additionalProperties": True,
}


def _plain(prop: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in prop.items() if k != "title"}


def arguments_schema(operation: Operation, *, without: frozenset[str] = frozenset()) -> Any:
    """The JSON schema of an operation's arguments, less the ones a route sets itself."""
    schema = operation.args.model_json_schema()
    properties = {
        name: _plain(prop)
        for name, prop in schema.get("properties", {}).items()
        if name not in without
    }
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name in schema.get("required", []) if name not in without],
        "additionalProperties": False,
    }


def tool_request_schema(tool: Tool) -> dict[str, Any]:
    """One variant per operation, told apart by ``operation``."""
    variants = []
    for operation in tool.operations.values():
        schema = arguments_schema(operation)
        operation_prop = {"const": operation.name, "description": operation.description}
        schema["properties"] = {"operation": operation_prop, **schema["properties"]}
        schema["required"] = ["operation", *schema["required"]]
        variants.append({"title": f"{tool.name}.{operation.name}", **schema})
    return {"oneOf": variants, "description": tool.description}


def _responses(*, body: bool) -> dict[str, Any]:
    json_result = {"application/json": {"schema": RESULT_REF}}
    responses = {"200": {"description": OK, "content": json_result}}
    for status, description in FAILURES.items():
        responses[status] = {"description": description, "content": json_result}
    if body:
        responses["413"] = {"description": TOO_LARGE, "content": json_result}
    return dict(sorted(responses.items()))


def _parameter(name: str, where: str, prop: dict[str, Any]) -> dict[str, Any]:
    options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
    schema = {k: v for k, v in options[0].items() if k != "title"}
    if where == "path":
        schema |= {"minLength": 1, "maxLength": 128, "pattern": "^[^/]+$"}
    elif schema.get("type") == "integer":
        schema["minimum"] = 0
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": prop.get("description", ""),
        "schema": schema,
    }


def _rest_operation(route: RestRoute) -> dict[str, Any]:
    operation = route.operation_spec
    properties = operation.args.model_json_schema().get("properties", {})
    parameters = [_parameter(n, "path", properties[n]) for n in route.path_params]
    parameters += [_parameter(n, "query", properties[n]) for n in route.query]
    spec: dict[str, Any] = {
        "operationId": f"{route.method.lower()}_{route.path.strip('/').replace('/', '_')}",
        "summary": route.summary,
        "description": f"The `{route.tool}` tool's `{route.operation}` operation.",
        "tags": ["resources"],
        "responses": _responses(body=route.body),
    }
    spec["operationId"] = spec["operationId"].replace("{", "").replace("}", "")
    if parameters:
        spec["parameters"] = parameters
    if route.body:
        schema = arguments_schema(operation, without=route.fixed)
        spec["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    return spec


def _events_operation() -> dict[str, Any]:
    read = TOOLS["terminal"].operations["read"].args.model_json_schema()["properties"]
    responses = _responses(body=False)
    responses["200"] = {
        "description": "Server-sent events: `output` (id: next_offset), then `exit`; `error` or "
        "`reconnect` (resume from its next_offset) end a stream early.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    return {
        "operationId": "stream_terminal_events",
        "summary": "Stream a terminal's output as it arrives",
        "description": "The terminal tool's `wait` in a loop. `Last-Event-ID` resumes.",
        "tags": ["resources"],
        "parameters": [
            _parameter("terminal_id", "path", read["terminal_id"]),
            _parameter("since_offset", "query", read["since_offset"]),
        ],
        "responses": responses,
    }


_NULLABLE_NUMBER = {"type": ["number", "null"]}
_NULLABLE_STRING = {"type": ["string", "null"]}
OPS_SCHEMAS: dict[str, Any] = {
    "OpsSession": {
        "type": "object",
        "required": ["session_id", "tenant", "task", "policy", "state", "age_s"],
        "properties": {
            "session_id": {"type": "string"},
            "tenant": {"type": "string"},
            "task": _NULLABLE_STRING,
            "policy": {"type": "string"},
            "state": {"enum": ["idle", "busy", "paused"]},
            "created_at": {"type": "string"},
            "age_s": {"type": "number"},
            "idle_s": {"type": "number"},
            "cpu_percent": {
                **_NULLABLE_NUMBER,
                "description": "Percent of one CPU between the last two samples (null before "
                "the second).",
            },
            "memory_mb": _NULLABLE_NUMBER,
            "memory_limit_mb": _NULLABLE_NUMBER,
            "sampled_at": {
                **_NULLABLE_STRING,
                "description": "When the figures were sampled (null: not yet).",
            },
        },
    },
    "OpsSessions": {
        "type": "object",
        "required": ["success", "tenant", "count", "sessions"],
        "properties": {
            "success": {"const": True},
            "tenant": {
                **_NULLABLE_STRING,
                "description": "The key's tenant (null: an operator's key, every tenant's).",
            },
            "operator": {"type": "boolean", "description": "Whether the key is an operator's."},
            "task": _NULLABLE_STRING,
            "count": {"type": "integer"},
            "sessions": {"type": "array", "items": {"$ref": "#/components/schemas/OpsSession"}},
        },
    },
    "OpsPools": {
        "type": "object",
        "required": ["success", "sessions", "starting", "max_sessions", "pools"],
        "properties": {
            "success": {"const": True},
            "sessions": {"type": "integer", "description": "Sessions held, every tenant's."},
            "starting": {"type": "integer", "description": "Sessions being made."},
            "max_sessions": {"type": "integer"},
            "pools": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["policy", "size", "ready"],
                    "properties": {
                        "policy": {"type": "string"},
                        "size": {"type": "integer"},
                        "ready": {"type": "integer"},
                    },
                },
            },
        },
    },
    "OpsAuditEvent": {
        "type": "object",
        "required": ["seq", "time", "tenant", "tool", "outcome"],
        "properties": {
            "seq": {"type": "integer"},
            "time": {"type": "string"},
            "tenant": {"type": "string"},
            "task": _NULLABLE_STRING,
            "tool": {"type": "string"},
            "operation": _NULLABLE_STRING,
            "session_id": _NULLABLE_STRING,
            "outcome": {"enum": ["ok", "failed", "cancelled"]},
            "error_type": _NULLABLE_STRING,
            "duration_ms": {"type": "number"},
            "call_id": _NULLABLE_STRING,
        },
    },
    "OpsAudit": {
        "type": "object",
        "required": ["success", "enabled", "count", "events"],
        "properties": {
            "success": {"const": True},
            "enabled": {"type": "boolean", "description": "Whether the server keeps a log."},
            "count": {"type": "integer"},
            "events": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/OpsAuditEvent"},
            },
        },
    },
}
# The failures an operations route can answer: it reads the server's own state, no engine.
OPS_FAILURES = ("400", "401", "403", "429", "500")


def _ops_operation(
    operation_id: str, summary: str, description: str, schema: str
) -> dict[str, Any]:
    json_result = {"application/json": {"schema": RESULT_REF}}
    responses: dict[str, Any] = {
        "200": {
            "description": "The answer",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }
    for status in OPS_FAILURES:
        description_of = FAILURES[status] if status != "400" else "invalid_argument"
        responses[status] = {"description": description_of, "content": json_result}
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": ["operations"],
        "responses": responses,
    }


def _ops_paths() -> dict[str, Any]:
    audit = _ops_operation(
        "ops_audit",
        "The latest audit records: the key's tenant's, or (an operator's key) every tenant's",
        "Newest first: what this server recorded since it started (none when it keeps no "
        "audit log: `enabled` false). Arguments and what workers claimed are left out.",
        "OpsAudit",
    )
    audit["parameters"] = [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": f"How many records (default {DEFAULT_AUDIT_LIMIT}).",
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_AUDIT_LIMIT},
        }
    ]
    return {
        OPS_SESSIONS_PATH: {
            "get": _ops_operation(
                "ops_sessions",
                "Sessions with CPU and memory: the key's tenant's, or every tenant's",
                "Owner, policy, state and age of each session; CPU and memory as last sampled "
                "from the engine (sampling runs while this is asked for; null until then). "
                "Touches no session.",
                "OpsSessions",
            )
        },
        OPS_POOLS_PATH: {
            "get": _ops_operation(
                "ops_pools",
                "Warm pools and how many sessions the server holds",
                "Each warm pool's policy, size and ready sessions, and the server's sessions "
                "(every tenant's, as a count) against its maximum. An operator's key only.",
                "OpsPools",
            )
        },
        OPS_AUDIT_PATH: {"get": audit},
    }


def _tool_operation(tool: Tool) -> dict[str, Any]:
    operations = "\n".join(f"- `{o.name}`: {o.description}" for o in tool.operations.values())
    return {
        "operationId": f"call_{tool.name}",
        "summary": f"Call the {tool.name} tool",
        "description": f"{tool.description}\n\nOperations:\n{operations}",
        "tags": ["tools"],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{tool.name}"}}
            },
        },
        "responses": _responses(body=True),
    }


def _version() -> str:
    try:
        return importlib.metadata.version("sandhold")
    except importlib.metadata.PackageNotFoundError:
        return "0"


# Every /v1 call may name a task scope within the key's tenant (``owners``).
TASK_PARAMETER = {
    "name": "X-Sandhold-Task",
    "in": "header",
    "required": False,
    "description": "The task the call acts for, within the API key's tenant; without it, the "
    "call acts for the tenant itself and sees all of its sessions.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"},
}
TASK_PARAMETER_REF = {"$ref": "#/components/parameters/task"}


def openapi_document() -> dict[str, Any]:
    json_object = {"application/json": {"schema": {"type": "object"}}}
    unauthorized = {
        "description": FAILURES["401"],
        "content": {"application/json": {"schema": RESULT_REF}},
    }
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness; needs no API key",
                "security": [],
                "responses": {"200": {"description": "The server answers", "content": json_object}},
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": {"description": "OpenAPI 3.1", "content": json_object},
                    "401": unauthorized,
                },
            }
        },
    }
    for route in REST_ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _rest_operation(route)
    paths[EVENTS_PATH] = {"get": _events_operation()}
    paths |= _ops_paths()
    for tool in TOOLS.values():
        paths[f"/v1/{tool.name}"] = {"post": _tool_operation(tool)}
    for path, methods in paths.items():
        if path.startswith("/v1/"):
            for operation in methods.values():
                operation.setdefault("parameters", []).append(TASK_PARAMETER_REF)
    schemas: dict[str, Any] = {"ToolResult": TOOL_RESULT_SCHEMA, **OPS_SCHEMAS}
    schemas |= {tool.name: tool_request_schema(tool) for tool in TOOLS.values()}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sandhold",
            "version": _version(),
            "description": "Container-isolated sandboxes: the python_repl, terminal, process and "
            "files tools over HTTP. `POST /v1/{tool}` takes the same arguments as the MCP tool "
            "and answers the same structured result; the other routes are shorthands.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
            "parameters": {"task": TASK_PARAMETER},
        },
        "security": [{"apiKey": []}],
    }
