"""Egress moved just before a session ends, against real containers on the test "internet" of
tests/docker/test_egress.py: sessions that download and are destroyed at once, several at a
time, are counted to the byte in the metrics (what ``/metrics`` serves) and in the tenant's
egress meter, so destroying each session right after its download does not evade the tenant's
``egress_mb``: the next session of that tenant is refused from its first request.

The proxy rewrites its totals file once a second; a session's last read asks the proxy instead
(``final`` on its control socket), which is what these tests tell apart. No reaper round helps:
the policy's idle timeout keeps rounds 30 s apart, and every assertion is made on what the
sessions' ends counted."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._core.tenants import TenantConfig, TenantQuotas
from orchestrator.backend.docker import DockerBackend
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.docker.test_egress import FETCH_IN_REPL, egress_backend, internet, runtime
from tests.docker.test_egress_quota import _samples

__all__ = ["egress_backend", "internet", "runtime"]  # the fixtures, shared with test_egress

pytestmark = pytest.mark.anyio

OPEN_POLICY = """
extends = "shell"
name = "egress-open"
{runtime}
[network]
mode = "open"
max_mb = 64
"""
# What the test web server answers before its padding: "hello <Host> ".
GREETING = len("hello allowed.test ")
# A response head from Python's http.server is well under this; a request head from urllib too.
HEAD_ROOM = 1024
# Creating a session (and its proxy) on a loaded machine, several at once.
SCENARIO_TIMEOUT = 240.0


def _config(
    worker_image: Any, tmp_path: Path, tenant: TenantConfig, runtime: str | None = None
) -> Any:
    from orchestrator._api import OrchestratorConfig

    line = f'runtime = "{runtime}"' if runtime else ""
    (tmp_path / "egress-open.toml").write_text(OPEN_POLICY.format(runtime=line))
    return OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
        policy_dirs=(tmp_path,),
        tenants={tenant.name: tenant},
    )


async def _download_and_destroy(orch: Any, size: int, tenant: str) -> None:
    """One session: a download of ``size`` padding bytes, then destroyed at once."""
    done = await orch.call(
        "python_repl",
        {
            "operation": "execute",
            "code": FETCH_IN_REPL + f"len(fetch('http://allowed.test/{size}'))",
            "policy": "egress-open",
        },
        tenant=tenant,
    )
    assert done.structured["result_repr"] == str(GREETING + size), done.structured
    sid = done.structured["session_id"]
    gone = await orch.call(
        "python_repl", {"operation": "destroy", "session_id": sid}, tenant=tenant
    )
    assert gone.structured["success"], gone.structured


def _bytes(orch: Any, tenant: str, direction: str) -> float:
    key = ("sandhold_egress_bytes_total", (("direction", direction), ("tenant", tenant)))
    return _samples(orch).get(key, 0.0)


async def test_sessions_destroyed_right_after_a_download_are_counted_to_the_byte(
    worker_image: Any, egress_backend: DockerBackend, tmp_path: Path, runtime: str | None
) -> None:
    from orchestrator._api import Orchestrator

    tenant = TenantConfig(name="local", key_sha256="0" * 64)
    # 960 KB in all, as the red team's three sessions moved; six sessions, since each of them
    # has about even odds that the proxy's once-a-second file caught its download anyway.
    sessions, size = 6, 160_000
    async with Orchestrator(
        _config(worker_image, tmp_path, tenant, runtime), backend=egress_backend
    ) as orch:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with anyio.create_task_group() as group:
                for _ in range(sessions):
                    group.start_soon(_download_and_destroy, orch, size, "local")
        received, sent = _bytes(orch, "local", "received"), _bytes(orch, "local", "sent")
        # Every body byte, and no more than the heads around them.
        assert sessions * (GREETING + size) <= received <= sessions * (GREETING + size + HEAD_ROOM)
        assert sessions * len("GET / HTTP/1.1\r\n") <= sent <= sessions * HEAD_ROOM
        assert orch.egress.meter.used("local") == received + sent


async def test_destroying_each_session_right_after_its_download_does_not_evade_the_quota(
    worker_image: Any, egress_backend: DockerBackend, tmp_path: Path
) -> None:
    from orchestrator._api import Orchestrator

    tenant = TenantConfig(name="quota", key_sha256="1" * 64, quotas=TenantQuotas(egress_mb=1))
    async with Orchestrator(
        _config(worker_image, tmp_path, tenant), backend=egress_backend
    ) as orch:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            # Two sessions at once, each well within the quota, together over it (1.2 MB).
            async with anyio.create_task_group() as group:
                for _ in range(2):
                    group.start_soon(_download_and_destroy, orch, 600_000, "quota")
            assert orch.egress.meter.used("quota") > 1 << 20
            # The next session is refused from its first request, with the quota's rule.
            probe = await orch.call(
                "python_repl",
                {
                    "operation": "execute",
                    "code": FETCH_IN_REPL + "fetch('http://allowed.test/')",
                    "policy": "egress-open",
                },
                tenant="quota",
            )
            assert probe.structured["result_repr"] == "403", probe.structured
            assert probe.structured["network_denied"] == [
                {"host": "allowed.test", "port": 80, "rule": "tenant.egress_mb"}
            ]
            sid = probe.structured["session_id"]
            await orch.call(
                "python_repl", {"operation": "destroy", "session_id": sid}, tenant="quota"
            )
            # Its refusal counted too, at its end.
            refused = (
                "sandhold_egress_refused_total",
                (("rule", "tenant.egress_mb"), ("tenant", "quota")),
            )
            assert _samples(orch).get(refused, 0) == 1
