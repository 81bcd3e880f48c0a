"""The operations page's side of the HTTP API, on the in-memory backend: ``/ui`` and its files
load without a key under a strict Content-Security-Policy and hold no key or inline script; the
``/v1/ops/*`` routes need a key, show the key's tenant (and task) only, refuse a bad argument
with ``invalid_argument``, and answer what the OpenAPI document says; every route of the app is
in that document. The page in a real browser is tests/docker/test_ui.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from orchestrator._api import Orchestrator
from orchestrator._core.owners import task_scope
from orchestrator._core.tenants import (
    OperatorConfig,
    TenantConfig,
    TenantKeys,
    hash_key,
    new_key,
)
from orchestrator.http import build_app, openapi_document
from orchestrator.http._ui import ASSETS, UI_PATH
from tests.unit.test_manager_on_fake import STEP_TIMEOUT, Worker, engine, settings

pytestmark = pytest.mark.anyio

KEY_A, KEY_B, KEY_OPS = new_key(), new_key(), new_key()
KEYS = TenantKeys(
    [
        TenantConfig(name="team-a", key_sha256=hash_key(KEY_A)),
        TenantConfig(name="team-b", key_sha256=hash_key(KEY_B)),
    ],
    [OperatorConfig(name="ops", key_sha256=hash_key(KEY_OPS))],
)
OPS_PATHS = ("/v1/ops/sessions", "/v1/ops/pools", "/v1/ops/audit")

Client = Callable[..., httpx.AsyncClient]


@pytest.fixture
async def orch(tmp_path: Path) -> AsyncIterator[Orchestrator]:
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(
            settings(audit_dir=tmp_path / "audit"), backend=engine(Worker())
        ) as started:
            yield started


@pytest.fixture
async def client(orch: Orchestrator) -> AsyncIterator[Client]:
    app = build_app(orch, KEYS, mcp=False)
    made: list[httpx.AsyncClient] = []

    def make(key: str | None = None, **headers: str) -> httpx.AsyncClient:
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers
        )
        made.append(http)
        return http

    yield make
    for http in made:
        await http.aclose()


def conforms(path: str, status: int, body: Any) -> None:
    """``body`` is what the OpenAPI document says ``GET path`` answers with ``status``."""
    document = openapi_document()
    response = document["paths"][path]["get"]["responses"][str(status)]
    schema = response["content"]["application/json"]["schema"]
    jsonschema.validate(body, {**schema, "components": document["components"]})


async def test_the_page_and_its_files_load_without_a_key_under_a_strict_policy(
    client: Client,
) -> None:
    http = client()
    for path in ASSETS:
        response = await http.get(path)
        assert response.status_code == 200, path
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "default-src 'none'" in policy and "'unsafe-inline'" not in policy
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
    assert (await http.get(f"{UI_PATH}/other.js")).status_code == 401


async def test_the_page_holds_no_inline_script_or_style_and_no_key(client: Client) -> None:
    page = (await client().get(UI_PATH)).text
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", page, re.S)
    assert scripts == [""]  # one script, from its own file
    assert re.search(r"<script\b[^>]*\bsrc=\"ui/ui\.js\"", page)
    assert "<style" not in page and " style=" not in page
    assert not re.search(r"<[^>]*\son\w+\s*=", page, re.I)  # no inline event handler
    assert KEY_A not in page and KEY_B not in page
    script = (await client().get(f"{UI_PATH}/ui.js")).text
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script


@pytest.mark.parametrize("path", OPS_PATHS)
async def test_every_ops_route_needs_a_valid_key(client: Client, path: str) -> None:
    for http in (client(), client(new_key())):
        response = await http.get(path)
        assert response.status_code == 401
        assert response.json()["error_type"] == "unauthenticated"


async def test_sessions_are_the_keys_tenants_and_a_task_narrows_them(
    client: Client, orch: Orchestrator
) -> None:
    mine = await orch.create_session(tenant="team-a")
    with task_scope("job-1"):
        tasks = await orch.create_session(tenant="team-a")
    theirs = await orch.create_session(tenant="team-b")
    answer = await client(KEY_A).get("/v1/ops/sessions")
    conforms("/v1/ops/sessions", 200, answer.json())
    listed = {s["session_id"]: s for s in answer.json()["sessions"]}
    assert set(listed) == {mine.id, tasks.id} and theirs.id not in listed
    assert listed[tasks.id]["task"] == "job-1" and listed[mine.id]["tenant"] == "team-a"
    narrowed = await client(KEY_A, **{"X-Sandhold-Task": "job-1"}).get("/v1/ops/sessions")
    assert [s["session_id"] for s in narrowed.json()["sessions"]] == [tasks.id]
    wrong = await client(KEY_A, **{"X-Sandhold-Task": "no spaces"}).get("/v1/ops/sessions")
    assert wrong.status_code == 400 and wrong.json()["error_type"] == "invalid_argument"


async def test_pools_give_each_pool_and_the_servers_sessions(
    client: Client, orch: Orchestrator
) -> None:
    await orch.create_session(tenant="team-b")
    answer = (await client(KEY_OPS).get("/v1/ops/pools")).json()
    conforms("/v1/ops/pools", 200, answer)
    assert answer["sessions"] == 1 and answer["max_sessions"] == orch.config.max_sessions
    assert answer["pools"] == []


async def test_audit_events_are_the_keys_tenants_newest_first(client: Client) -> None:
    a, b = client(KEY_A), client(KEY_B)
    made = (await a.post("/v1/sessions", json={"code": "1"})).json()
    await a.post("/v1/python_repl", json={"operation": "<img src=x>"})
    await b.post("/v1/sessions", json={"code": "2"})
    answer = (await a.get("/v1/ops/audit", params={"limit": 10})).json()
    conforms("/v1/ops/audit", 200, answer)
    assert answer["enabled"] is True
    events = answer["events"]
    assert [(e["operation"], e["error_type"]) for e in events] == [
        ("<img src=x>", "invalid_argument"),
        ("execute", None),
    ]
    assert events[1]["session_id"] == made["session_id"]
    assert {e["tenant"] for e in events} == {"team-a"}
    assert len((await a.get("/v1/ops/audit", params={"limit": 1})).json()["events"]) == 1


@pytest.mark.parametrize("path", ["/v1/ops/pools", "/metrics"])
async def test_the_whole_servers_figures_need_an_operators_key(client: Client, path: str) -> None:
    refused = await client(KEY_A).get(path)
    assert refused.status_code == 403
    assert (refused.json()["error_type"], refused.json()["rule"]) == ("policy", "role.operator")
    assert (await client(KEY_OPS).get(path)).status_code == 200


async def test_an_operator_sees_every_tenants_sessions_and_records_and_calls_no_tool(
    client: Client, orch: Orchestrator
) -> None:
    await client(KEY_A).post("/v1/sessions", json={"code": "1"})
    await client(KEY_B).post("/v1/sessions", json={"code": "2"})
    sessions = (await client(KEY_OPS).get("/v1/ops/sessions")).json()
    conforms("/v1/ops/sessions", 200, sessions)
    assert sessions["operator"] is True and sessions["tenant"] is None
    assert sorted(s["tenant"] for s in sessions["sessions"]) == ["team-a", "team-b"]
    audit = (await client(KEY_OPS).get("/v1/ops/audit")).json()
    assert {e["tenant"] for e in audit["events"]} == {"team-a", "team-b"}
    mine = (await client(KEY_A).get("/v1/ops/sessions")).json()
    assert [s["tenant"] for s in mine["sessions"]] == ["team-a"] and mine["operator"] is False
    assert (await client(KEY_OPS).get("/openapi.json")).status_code == 200
    refused = await client(KEY_OPS).post("/v1/sessions", json={"code": "1"})
    assert refused.status_code == 403 and refused.json()["rule"] == "role.tenant"


@pytest.mark.parametrize("limit", ["0", "201", "ten", "1.5", "٣"])
async def test_a_bad_audit_limit_is_invalid_argument(client: Client, limit: str) -> None:
    response = await client(KEY_A).get("/v1/ops/audit", params={"limit": limit})
    assert response.status_code == 400
    conforms("/v1/ops/audit", 400, response.json())
    assert response.json()["error_type"] == "invalid_argument"


async def test_without_an_audit_log_the_audit_route_says_so(tmp_path: Path) -> None:
    with anyio.fail_after(STEP_TIMEOUT):
        async with Orchestrator(settings(), backend=engine(Worker())) as orch:
            app = build_app(orch, KEYS, mcp=False)
            headers = {"Authorization": f"Bearer {KEY_A}"}
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://t", headers=headers
            ) as http:
                answer = (await http.get("/v1/ops/audit")).json()
    assert answer == {"success": True, "enabled": False, "count": 0, "events": []}


async def test_every_route_of_the_app_is_in_the_openapi_document_or_is_not_api(
    orch: Orchestrator,
) -> None:
    app: Any = build_app(orch, KEYS, mcp=False)
    while not isinstance(app, Starlette):
        app = app.app
    documented = openapi_document()["paths"]
    # Not API: the operator's probes and scrape, and the page's files.
    outside = {"/readyz", "/metrics", *ASSETS}
    missing = []
    for route in app.routes:
        assert isinstance(route, Route)
        if route.path in outside or route.path == "/v1/{tool}":
            continue
        for method in route.methods or ():
            if method != "HEAD" and method.lower() not in documented.get(route.path, {}):
                missing.append(f"{method} {route.path}")
    assert missing == []
