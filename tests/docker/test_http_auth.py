"""What a client without a valid key meets on ``sandhold serve``'s app, served by uvicorn on
loopback: OAuth discovery probes answer 404 (there is no OAuth here), and the official MCP client
raises a wrong or missing key as an ``unauthenticated`` error, not a generic one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from mcp import MCPError

from orchestrator._api import Orchestrator
from orchestrator.http import build_app
from orchestrator.images import ImageBuildResult
from tests.docker.test_http_api import CALL_TIMEOUT, KEY_A, KEYS, serving
from tests.docker.test_mcp_http import client_with_key
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# What MCP clients and OAuth libraries probe (RFC 9728, RFC 8414, OpenID Connect discovery).
DISCOVERY_PATHS = (
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server",
    "/.well-known/oauth-authorization-server/mcp",
    "/.well-known/openid-configuration",
)


@pytest.fixture
async def url(worker_image: ImageBuildResult) -> AsyncIterator[str]:
    async with (
        Orchestrator(config(worker_image.tag)) as orch,
        serving(build_app(orch, KEYS)) as url,
    ):
        yield url


async def test_oauth_discovery_answers_404_with_or_without_a_key(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT) as http:
        for path in DISCOVERY_PATHS:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY_A}):
                response = await http.get(path, headers=headers)
                assert response.status_code == 404, (path, headers)
                assert response.json()["error_type"] == "invalid_argument"


async def test_a_given_wrong_key_is_named_an_invalid_token_in_the_challenge(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT) as http:
        missing = await http.get("/v1/sessions")
        wrong = await http.get("/v1/sessions", headers={"Authorization": "Bearer wrong"})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error_type"] == wrong.json()["error_type"] == "unauthenticated"
    assert 'error="invalid_token"' not in missing.headers["www-authenticate"]
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


def unauthenticated(error: MCPError) -> bool:
    return error.message.startswith("unauthenticated: ") and (
        error.data["error_type"] == "unauthenticated"
    )


@pytest.mark.parametrize("key", ["wrong", None])
async def test_the_mcp_client_raises_a_bad_key_as_unauthenticated(
    url: str, key: str | None
) -> None:
    # The client's task groups wrap the error it raises (once per level): the MCPError inside
    # is the one a user reads.
    with (
        anyio.fail_after(CALL_TIMEOUT),
        pytest.RaisesGroup(
            pytest.RaisesExc(MCPError, check=unauthenticated), flatten_subgroups=True
        ),
    ):
        async with client_with_key(f"{url}/mcp", key) as client:
            await client.list_tools()


async def test_the_mcp_client_with_a_valid_key_connects(url: str) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_with_key(f"{url}/mcp", KEY_A) as client:
            assert (await client.list_tools()).tools
