"""Property-based: schemathesis drives every operation of the HTTP API's own OpenAPI document,
with data that fits the schema and data that does not, against a real server on 127.0.0.1 with
real containers, and no answer may be a 5xx or stray from the documented responses.

The server (orchestrator and uvicorn) runs in a thread with an event loop of its own, since
schemathesis calls it synchronously; its teardown removes every session the examples created.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator._api import Orchestrator
from orchestrator._core.tenants import TenantKeys, new_key
from orchestrator.http import build_app, openapi_document
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker]

KEY = new_key()
# Examples per API operation: enough to reach every operation's branches, few enough for 2 cores.
MAX_EXAMPLES = 15
# The orchestrator starts in well under this; its teardown is bounded by its own shutdown timeout.
STARTUP_TIMEOUT = 60.0
SHUTDOWN_TIMEOUT = 90.0

schema = schemathesis.openapi.from_dict(openapi_document())


@dataclass(frozen=True)
class Served:
    url: str
    headers: dict[str, str]


@pytest.fixture(scope="module")
def served(worker_image: ImageBuildResult) -> Iterator[Served]:
    listener = socket.create_server(("127.0.0.1", 0))
    started = threading.Event()
    servers: list[uvicorn.Server] = []
    failures: list[BaseException] = []

    async def serve() -> None:
        async with Orchestrator(config(worker_image.tag)) as orchestrator:
            app = build_app(orchestrator, TenantKeys.single("fuzz", KEY))
            server = uvicorn.Server(
                uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
            )
            servers.append(server)
            started.set()
            await server.serve(sockets=[listener])

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:
            failures.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=run, name="sandhold-http-under-test", daemon=True)
    thread.start()
    try:
        assert started.wait(STARTUP_TIMEOUT) and not failures, failures
        port = listener.getsockname()[1]
        yield Served(f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"})
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(SHUTDOWN_TIMEOUT)
        listener.close()
    assert not thread.is_alive(), "the server did not stop in time"
    assert not failures, failures


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_request_the_schema_describes_gets_a_server_error(
    case: schemathesis.Case[Any], served: Served
) -> None:
    case.call_and_validate(
        base_url=served.url,
        headers=served.headers,
        timeout=120,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
