"""What the fault tests share: an orchestrator on the private engine with its REST app in-process,
a policy whose sessions have an egress network, and calls that are always bounded."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator._core.tenants import TenantConfig, TenantKeys, hash_key, new_key
from orchestrator.backend.docker import DockerBackend, DockerClient, EgressSettings
from orchestrator.http import HttpLimitsConfig, build_app
from tests.conftest import TEST_ORCHESTRATOR_ID
from tests.faults.conftest import FaultCase

__all__ = [
    "EGRESS_POLICY",
    "KEY",
    "Faulted",
    "bounded",
    "faulted",
    "write_policies",
]

KEY = new_key()
KEYS = TenantKeys([TenantConfig(name="faults", key_sha256=hash_key(KEY))])
EGRESS_POLICY = "faults-egress"
# A session is a container and a worker: seconds on a loaded 2-core machine, not a minute.
CALL_TIMEOUT = 60.0
# The engine calls of an orchestrator under test: short, so that a frozen engine is noticed.
API_TIMEOUT = 10.0


def write_policies(directory: Path) -> Path:
    """A policy whose sessions sit on an egress network of their own (a network and a proxy
    container each), so that what an engine fault leaves of those is seen too."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{EGRESS_POLICY}.toml").write_text(
        'extends = "default"\n'
        f'name = "{EGRESS_POLICY}"\n'
        "[network]\n"
        'mode = "allowlist"\n'
        'allow = ["example.com:443"]\n'
    )
    return directory


class Faulted:
    """One orchestrator on the private engine, and its REST face."""

    def __init__(self, orch: Orchestrator, http: httpx.AsyncClient, backend: DockerBackend):
        self.orch = orch
        self.http = http
        self.backend = backend

    async def rest(self, tool: str, timeout: float = CALL_TIMEOUT, **args: Any) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            response = await self.http.post(f"/v1/{tool}", json=args)
        body: dict[str, Any] = response.json()
        body["_status"] = response.status_code
        return body

    async def call(self, tool: str, timeout: float = CALL_TIMEOUT, **args: Any) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            result = await self.orch.call(tool, args)
        return result.structured

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        with anyio.fail_after(CALL_TIMEOUT):
            response = await self.http.get("/readyz")
        return response.status_code, response.json()


@contextlib.asynccontextmanager
async def faulted(case: FaultCase, tmp_path: Path, **overrides: Any) -> AsyncIterator[Faulted]:
    """An orchestrator whose engine is the private one (its engine calls time out after
    ``API_TIMEOUT``), with a registry file and an audit log under ``tmp_path``."""
    settings: dict[str, Any] = {
        "image": case.image,
        "orchestrator_id": f"{TEST_ORCHESTRATOR_ID}-{case.case}",
        "extra_labels": case.extra_labels,
        "policy_dirs": (write_policies(tmp_path / "policies"),),
        "registry_path": tmp_path / "registry.db",
        "audit_dir": tmp_path / "audit",
    }
    settings.update(overrides)
    backend = DockerBackend(DockerClient(api_timeout=API_TIMEOUT), egress=EgressSettings.from_env())
    try:
        async with Orchestrator(OrchestratorConfig(**settings), backend=backend) as orch:
            app = build_app(orch, KEYS, mcp=False, limits=HttpLimitsConfig())
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://testserver",
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=CALL_TIMEOUT,
            ) as http:
                yield Faulted(orch, http, backend)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.aclose()


async def bounded(timeout: float, fn: Any, *args: Any) -> Any:
    with anyio.fail_after(timeout):
        return await fn(*args)
