"""The HTTP API against real containers: API keys, the scenario over REST and tool routes, wrong
arguments answered like every other interface, tenants kept apart, terminal output as
server-sent events, and the OpenAPI document."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from openapi_spec_validator import validate

from orchestrator._api import Orchestrator
from orchestrator._core.tenants import (
    OperatorConfig,
    TenantConfig,
    TenantKeys,
    hash_key,
    new_key,
)
from orchestrator.http import HttpLimitsConfig, build_app
from orchestrator.images import ImageBuildResult
from orchestrator.tools import TOOLS
from tests.docker.test_mcp_http import client_with_key
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

KEY_A, KEY_B, KEY_OPS = new_key(), new_key(), new_key()
KEYS = TenantKeys(
    [
        TenantConfig(name="tenant-a", key_sha256=hash_key(KEY_A)),
        TenantConfig(name="tenant-b", key_sha256=hash_key(KEY_B)),
    ],
    [OperatorConfig(name="ops", key_sha256=hash_key(KEY_OPS))],
)
# Creating a session (container and worker) takes well under this on the CI machine.
CALL_TIMEOUT = 60
# uvicorn waits this long for open connections when a test stops it.
GRACEFUL_SHUTDOWN_TIMEOUT = 5

Client = Callable[[str], httpx.AsyncClient]


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


@pytest.fixture
async def client(orch: Orchestrator) -> AsyncIterator[Client]:
    """Clients of the app in-process, one per API key (or none)."""
    # Every test's requests come from one address; the wrong-key budget is tested on its own.
    app = build_app(orch, KEYS, mcp=False, limits=HttpLimitsConfig(auth_failures_per_minute=10**6))
    async with contextlib.AsyncExitStack() as stack:

        def make(key: str = KEY_A) -> httpx.AsyncClient:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            made = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://testserver",
                headers=headers,
                timeout=CALL_TIMEOUT,
            )
            stack.push_async_callback(made.aclose)
            return made

        yield make


async def ok(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert response.status_code == 200 and body["success"] is True, body
    return dict(body)


async def test_every_route_but_healthz_needs_a_valid_key(client: Client) -> None:
    http = client("")
    for authorization in (None, "Basic abc", "Bearer", f"Bearer {new_key()}", KEY_A):
        headers = {"Authorization": authorization} if authorization else {}
        for method, path in [
            ("GET", "/openapi.json"),
            ("GET", "/v1/sessions"),
            ("POST", "/v1/python_repl"),
            ("GET", "/v1/terminals/t/events"),
            ("GET", "/nowhere"),
            ("POST", "/mcp"),
        ]:
            body = {"operation": "list_sessions"}
            response = await http.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (authorization, method, path)
            assert response.json()["error_type"] == "unauthenticated"
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    assert (await client(KEY_A).get("/openapi.json")).status_code == 200


async def test_the_scenario_runs_over_http(client: Client) -> None:
    http = client(KEY_A)
    with anyio.fail_after(CALL_TIMEOUT * 3):
        created = await ok(await http.post("/v1/sessions", json={"code": "x = 41"}))
        sid = created["session_id"]
        assert created["created_new_session"]

        run = await ok(await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x + 1"}))
        assert run["result_repr"] == "42" and run["session_id"] == sid

        shell = await ok(await http.post(f"/v1/sessions/{sid}/shell", json={"command": "echo hi"}))
        assert shell["stdout"].strip() == "hi" and shell["exit_code"] == 0

        started = await ok(
            await http.post(
                "/v1/process", json={"operation": "start", "session_id": sid, "command": "sleep 60"}
            )
        )
        listing = await ok(await http.get("/v1/processes", params={"session_id": sid}))
        assert [p["process_id"] for p in listing["processes"]] == [started["process_id"]]
        assert listing["processes"][0]["state"] == "running"

        write = {"operation": "write", "session_id": sid, "path": "notes/a.txt", "content": "hej"}
        await ok(await http.post("/v1/files", json=write))
        read = {"operation": "read", "session_id": sid, "path": "notes/a.txt"}
        assert (await ok(await http.post("/v1/files", json=read)))["content"] == "hej"

        assert [
            s["session_id"] for s in (await ok(await http.get("/v1/sessions")))["sessions"]
        ] == [sid]
        assert (await ok(await http.delete(f"/v1/sessions/{sid}")))["destroyed"] is True
        assert (await ok(await http.get("/v1/sessions")))["count"] == 0
        gone = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
        assert gone.status_code == 404 and gone.json()["error_type"] == "session_not_found"


async def test_a_failure_of_the_users_code_is_an_answer_not_a_failed_request(
    client: Client,
) -> None:
    http = client(KEY_A)
    with anyio.fail_after(CALL_TIMEOUT):
        response = await http.post("/v1/python_repl", json={"operation": "execute", "code": "1/0"})
    body = response.json()
    assert response.status_code == 200
    assert body["success"] is False and body["error_type"] == "ZeroDivisionError"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/python_repl", {"operation": "execute", "code": "1", "timeout_s": "5"}),
        ("/v1/python_repl", {"operation": "nope"}),
        ("/v1/python_repl", {"code": "1"}),
        ("/v1/files", {"operation": "read", "session_id": "x", "path": "a", "surprise": 1}),
        ("/v1/nosuchtool", {"operation": "execute"}),
        ("/v1/python_repl", [1, 2]),
        ("/v1/python_repl", "execute"),
        ("/v1/sessions", {"code": "1", "session_id": "abc"}),
        ("/v1/sessions", {"code": 1}),
        ("/v1/sessions", ["code"]),
        ("/v1/sessions/abc/execute", {"code": "1", "operation": "reset"}),
        ("/v1/sessions/abc/shell", {}),
    ],
)
async def test_a_wrong_argument_is_invalid_argument_with_400(
    client: Client, path: str, body: object
) -> None:
    response = await client(KEY_A).post(path, json=body)
    answer = response.json()
    assert response.status_code == 400, answer
    assert answer["success"] is False and answer["error_type"] == "invalid_argument"
    assert answer["error_message"]


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"operation": NaN}', b"\xff\xfe", b'"\\ud800"', b"[" * 100_000],
    ids=["empty", "truncated", "nan", "not-utf8", "lone-surrogate", "deep"],
)
async def test_a_malformed_body_is_invalid_argument_with_400(
    client: Client, content: bytes
) -> None:
    response = await client(KEY_A).post("/v1/python_repl", content=content)
    assert response.status_code == 400
    assert response.json()["error_type"] == "invalid_argument"


async def test_a_body_over_the_cap_is_refused_with_413(orch: Orchestrator) -> None:
    app = build_app(orch, KEYS, max_body_bytes=1024, mcp=False)
    headers = {"Authorization": f"Bearer {KEY_A}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers
    ) as http:
        declared = await http.post("/v1/files", content=b"x" * 2048)

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(4):
                yield b" " * 512

        streamed = await http.post("/v1/files", content=chunks())
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error_type"] == "invalid_argument"


async def test_requests_refused_before_a_tool_runs_are_counted_and_audited(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with Orchestrator(config(worker_image.tag, audit_dir=tmp_path)) as orch:
        app = build_app(orch, KEYS, max_body_bytes=1024, mcp=False)
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers
        ) as http:
            with anyio.fail_after(CALL_TIMEOUT):
                too_large = await http.post("/v1/files", content=b"x" * 2048)
                not_json = await http.post("/v1/files", content=b"{nope")
                operator = {"Authorization": f"Bearer {KEY_OPS}"}
                metrics = (await http.get("/metrics", headers=operator)).text
    assert (too_large.status_code, not_json.status_code) == (413, 400)
    counted = {
        sample.labels["status"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "sandhold_http_refusals_total"
    }
    assert counted == {"413": 1.0, "400": 1.0}
    records = await anyio.to_thread.run_sync(_audit_records, tmp_path)
    refused = [r for r in records if (r.get("tool"), r.get("operation")) == ("http", "refuse")]
    assert [r["error_type"] for r in refused] == ["invalid_argument", "invalid_argument"]
    assert {r["tenant"] for r in refused} == {"tenant-a"}


def _audit_records(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for segment in sorted(directory.glob("audit-*.jsonl"))
        for line in segment.read_text().splitlines()
    ]


async def test_unknown_routes_and_methods_answer_json(client: Client) -> None:
    http = client(KEY_A)
    missing = await http.get("/v2/anything")
    wrong_method = await http.put("/v1/sessions")
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert missing.json()["success"] is False and wrong_method.json()["success"] is False


async def test_another_tenants_session_answers_like_an_unknown_one(client: Client) -> None:
    a, b = client(KEY_A), client(KEY_B)
    with anyio.fail_after(CALL_TIMEOUT * 2):
        sid = (await ok(await a.post("/v1/sessions", json={"code": "secret = 1"})))["session_id"]
        start = {"operation": "start", "session_id": sid, "command": "sleep 30", "yield_time_ms": 0}
        terminal = (await ok(await a.post("/v1/terminal", json=start)))["terminal_id"]
        unknown_sid, unknown_terminal = "0" * 32, "term_" + "0" * 32

        assert (await ok(await b.get("/v1/sessions")))["count"] == 0
        assert (await ok(await b.get("/v1/processes")))["count"] == 0
        attempts: list[tuple[str, str, dict[str, Any] | None, str, str]] = [
            ("POST", "/v1/sessions/{}/execute", {"code": "secret"}, sid, unknown_sid),
            ("POST", "/v1/sessions/{}/shell", {"command": "ls"}, sid, unknown_sid),
            ("GET", "/v1/sessions/{}/history", None, sid, unknown_sid),
            ("GET", "/v1/processes?session_id={}", None, sid, unknown_sid),
            ("DELETE", "/v1/sessions/{}", None, sid, unknown_sid),
            ("GET", "/v1/terminals/{}", None, terminal, unknown_terminal),
            ("GET", "/v1/terminals/{}/events", None, terminal, unknown_terminal),
        ]
        for method, template, body, theirs, unknown in attempts:
            other = await b.request(method, template.format(theirs), json=body)
            missing = await b.request(method, template.format(unknown), json=body)
            assert other.status_code == missing.status_code == 404, template
            assert other.json() == json.loads(missing.text.replace(unknown, theirs)), template
        files = {"operation": "read", "session_id": sid, "path": "a.txt"}
        other = await b.post("/v1/files", json=files)
        missing = await b.post("/v1/files", json=files | {"session_id": unknown_sid})
        assert other.status_code == missing.status_code == 404
        assert other.json() == json.loads(missing.text.replace(unknown_sid, sid))

        # Still there for its owner.
        assert (await ok(await a.post(f"/v1/sessions/{sid}/execute", json={"code": "secret"})))[
            "result_repr"
        ] == "1"


async def test_another_tasks_session_answers_like_an_unknown_one(client: Client) -> None:
    """``X-Sandhold-Task`` scopes a call within the key's tenant: task t1's session is invisible to
    task t2 (the same answer as an unknown id), visible to the tenant without a task, and a
    malformed task name is refused before anything runs."""
    tenant = client(KEY_A)
    t1 = {"X-Sandhold-Task": "t1"}
    t2 = {"X-Sandhold-Task": "t2"}
    with anyio.fail_after(CALL_TIMEOUT * 2):
        made = await tenant.post("/v1/sessions", json={"code": "mine = 1"}, headers=t1)
        sid = (await ok(made))["session_id"]
        unknown_sid = "0" * 32
        other = await tenant.post(f"/v1/sessions/{sid}/execute", json={"code": "mine"}, headers=t2)
        missing = await tenant.post(
            f"/v1/sessions/{unknown_sid}/execute", json={"code": "mine"}, headers=t2
        )
        assert other.status_code == missing.status_code == 404
        assert other.json() == json.loads(missing.text.replace(unknown_sid, sid))
        assert (await ok(await tenant.get("/v1/sessions", headers=t2)))["count"] == 0
        listed = (await ok(await tenant.get("/v1/sessions")))["sessions"]
        assert [(s["session_id"], s["task"]) for s in listed] == [(sid, "t1")]
        again = await tenant.post(f"/v1/sessions/{sid}/execute", json={"code": "mine"}, headers=t1)
        assert (await ok(again))["result_repr"] == "1"
        bad = await tenant.get("/v1/sessions", headers={"X-Sandhold-Task": "no spaces"})
        assert bad.status_code == 400 and bad.json()["error_type"] == "invalid_argument"


def parse_events(text: str) -> list[tuple[str, dict[str, Any] | None]]:
    """(event, data) pairs of an SSE body; comments are ``(":", None)``."""
    events: list[tuple[str, dict[str, Any] | None]] = []
    for block in filter(None, text.split("\n\n")):
        if block.startswith(":"):
            events.append((":", None))
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_terminal_output_streams_as_server_sent_events_until_exit(client: Client) -> None:
    http = client(KEY_A)
    command = "for i in 1 2 3; do echo line-$i; sleep 0.5; done; exit 3"
    with anyio.fail_after(CALL_TIMEOUT):
        start = {"operation": "start", "command": command, "use_pty": False, "yield_time_ms": 0}
        terminal = (await ok(await http.post("/v1/terminal", json=start)))["terminal_id"]
        response = await http.get(f"/v1/terminals/{terminal}/events")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_events(response.text)
    outputs = [data for name, data in events if name == "output" and data]
    assert "".join(d["output"] for d in outputs) == "line-1\nline-2\nline-3\n"
    assert len(outputs) >= 2  # chunks as they came, not one answer at the end
    assert events[-1][0] == "exit"
    last = events[-1][1]
    assert last is not None and last["exit_code"] == 3

    # Resuming from a cursor sends only what came after it.
    resumed = await http.get(f"/v1/terminals/{terminal}/events", params={"since_offset": 7})
    assert "".join(d["output"] for n, d in parse_events(resumed.text) if n == "output" and d) == (
        "line-2\nline-3\n"
    )
    by_header = await http.get(f"/v1/terminals/{terminal}/events", headers={"Last-Event-ID": "14"})
    assert "line-3" in by_header.text and "line-2" not in by_header.text


BAD_CURSORS = ["²", "١٢", "-1", "9" * 40, str(2**62 + 1), "1e3", " 7", "7\n", "0x10"]


async def test_a_malformed_cursor_is_refused_after_the_owner_is_checked(client: Client) -> None:
    """Only ASCII digits are a cursor ("²".isdigit() is true); a caller who may not see the
    terminal hears "not found" whatever the cursor, its owner hears invalid_argument."""
    a, b = client(KEY_A), client(KEY_B)
    with anyio.fail_after(CALL_TIMEOUT * 2):
        start = {"operation": "start", "command": "echo hi", "use_pty": False}
        terminal = (await ok(await a.post("/v1/terminal", json=start)))["terminal_id"]
        unknown = "term_" + "0" * 32
        events = f"/v1/terminals/{terminal}/events"
        for cursor in BAD_CURSORS:
            by_query = await a.get(events, params={"since_offset": cursor})
            read = await a.get(f"/v1/terminals/{terminal}", params={"since_offset": cursor})
            for response in (by_query, read):
                assert response.status_code == 400, (cursor, response.text)
                assert response.json()["error_type"] == "invalid_argument"
            if cursor.isprintable() and cursor.strip() == cursor:  # a valid header value
                by_header = await a.get(events, headers={b"Last-Event-ID": cursor.encode()})
                assert by_header.status_code == 400, cursor
            other = await b.get(events, params={"since_offset": cursor})
            missing = await b.get(
                f"/v1/terminals/{unknown}/events", params={"since_offset": cursor}
            )
            assert other.status_code == missing.status_code == 404, cursor
            assert other.json() == json.loads(missing.text.replace(unknown, terminal))
        resumed = await a.get(events, params={"since_offset": "1"})
        assert resumed.status_code == 200 and "event: exit" in resumed.text


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """uvicorn on a loopback port bound before it starts; the base URL."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        )
    )
    with sock:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                server.should_exit = True


async def test_server_sent_events_arrive_while_the_terminal_still_runs(orch: Orchestrator) -> None:
    headers = {"Authorization": f"Bearer {KEY_A}"}
    async with (
        serving(build_app(orch, KEYS)) as url,
        httpx.AsyncClient(base_url=url, headers=headers, timeout=CALL_TIMEOUT) as http,
    ):
        start = {"operation": "start", "command": "echo first; sleep 600", "yield_time_ms": 0}
        with anyio.fail_after(CALL_TIMEOUT):
            terminal = (await ok(await http.post("/v1/terminal", json=start)))["terminal_id"]
            async with http.stream("GET", f"/v1/terminals/{terminal}/events") as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith("data: ") and "first" in line:
                        break
            kill = {"operation": "kill", "terminal_id": terminal, "signal": "KILL"}
            assert (await ok(await http.post("/v1/terminal", json=kill)))["state"] == "exited"


async def test_the_openapi_document_is_valid_and_covers_every_tool(client: Client) -> None:
    response = await client(KEY_A).get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    validate(document)
    assert document["openapi"].startswith("3.")
    for name, tool in TOOLS.items():
        operation = document["paths"][f"/v1/{name}"]["post"]
        assert set(operation["responses"]) >= {"200", "400", "401", "404"}
        variants = document["components"]["schemas"][name]["oneOf"]
        assert [v["properties"]["operation"]["const"] for v in variants] == list(tool.operations)
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert "/v1/terminals/{terminal_id}/events" in document["paths"]
    assert document["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"


async def test_mcp_at_slash_mcp_calls_tools_as_the_keys_tenant(orch: Orchestrator) -> None:
    with anyio.fail_after(CALL_TIMEOUT * 2):
        async with (
            serving(build_app(orch, KEYS)) as url,
            client_with_key(f"{url}/mcp", KEY_A) as mcp_a,
            httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT) as http,
        ):
            made = await mcp_a.call_tool("python_repl", {"operation": "execute", "code": "7 * 6"})
            structured = made.structured_content
            assert not made.is_error and isinstance(structured, dict), made
            sid = structured["session_id"]
            assert [s["session_id"] for s in orch.list_sessions(tenant="tenant-a")] == [sid]

            as_b = {"Authorization": f"Bearer {KEY_B}"}
            other = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}, headers=as_b)
            assert other.status_code == 404
            no_key = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert no_key.status_code == 401
