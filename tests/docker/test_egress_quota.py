"""A tenant's egress byte quota against real containers, on the test "internet" of
tests/docker/test_egress.py: a download larger than the quota goes through, the next reaper
round finds the tenant over, and its proxies then refuse with rule ``tenant.egress_mb``; the
bytes and the refusal are counted in the metrics."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator._core.tenants import TenantConfig, TenantQuotas
from orchestrator.backend.docker import DockerBackend
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.docker.test_egress import FETCH_IN_REPL, egress_backend, internet

__all__ = ["egress_backend", "internet"]  # the fixtures, shared with test_egress

pytestmark = pytest.mark.anyio

OPEN_POLICY = """
extends = "shell"
name = "egress-open"
[network]
mode = "open"
max_mb = 64
"""
TWO_MIB = 2 << 20


def _samples(orch: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = orch.metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_tenant_over_its_egress_quota_is_refused_with_its_rule_and_counted(
    worker_image: Any, egress_backend: DockerBackend, tmp_path: Path
) -> None:
    from orchestrator._api import Orchestrator, OrchestratorConfig

    (tmp_path / "egress-open.toml").write_text(OPEN_POLICY)
    tenant = TenantConfig(name="local", key_sha256="0" * 64, quotas=TenantQuotas(egress_mb=1))
    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
        policy_dirs=(tmp_path,),
        tenants={"local": tenant},
        reap_interval=0.2,
    )
    async with Orchestrator(config, backend=egress_backend) as orch:
        with anyio.fail_after(120):
            # Created and used at once: the proxy answers from the first request on.
            first = await orch.call(
                "python_repl",
                {
                    "operation": "execute",
                    "code": FETCH_IN_REPL + "len(fetch('http://allowed.test/'))",
                    "policy": "egress-open",
                },
            )
            assert first.structured["result_repr"] == str(len("hello allowed.test "))
            sid = first.structured["session_id"]
            big = await orch.call(
                "python_repl",
                {
                    "operation": "execute",
                    "session_id": sid,
                    "code": f"len(fetch('http://allowed.test/{TWO_MIB}'))",
                },
            )
            # Within the quota when it began: it goes through whole (enforcement is per round).
            assert int(big.structured["result_repr"]) > TWO_MIB
            answer = None
            while answer != "403":
                await anyio.sleep(0.2)  # a reaper round must read the proxy first
                probe = await orch.call(
                    "python_repl",
                    {
                        "operation": "execute",
                        "session_id": sid,
                        "code": "fetch('http://allowed.test/')",
                    },
                )
                answer = probe.structured["result_repr"]
            assert probe.structured["network_denied"][-1]["rule"] == "tenant.egress_mb"
            log = await orch.network_log(sid)
            assert log[-1]["decision"] == "deny" and log[-1]["rule"] == "tenant.egress_mb"
            received = (
                "sandhold_egress_bytes_total",
                (("direction", "received"), ("tenant", "local")),
            )
            refused = (
                "sandhold_egress_refused_total",
                (("rule", "tenant.egress_mb"), ("tenant", "local")),
            )
            while _samples(orch).get(refused, 0) < 1:  # noqa: ASYNC110 (no event: the next read)
                await anyio.sleep(0.2)  # counted at the next read of the proxy's totals
            found = _samples(orch)
            assert found[received] > TWO_MIB
            assert (
                found[("sandhold_egress_bytes_total", (("direction", "sent"), ("tenant", "local")))]
                > 0
            )


async def test_a_tenants_egress_cap_narrows_its_sessions_pooled_ones_too_and_live_changes(
    worker_image: Any, egress_backend: DockerBackend, tmp_path: Path
) -> None:
    """``egress_allow`` in the tenants file: an ``open`` policy's session of the capped tenant
    (taken warm from the pool, made before its tenant was known) reaches only the cap; another
    tenant's session of the same policy is not capped; a live change stays within the cap."""
    from orchestrator._api import Orchestrator, OrchestratorConfig

    (tmp_path / "egress-open.toml").write_text(OPEN_POLICY)
    tenants = {
        "capped": TenantConfig(name="capped", key_sha256="1" * 64, egress_allow=["allowed.test"]),
        "free": TenantConfig(name="free", key_sha256="2" * 64),
    }
    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
        policy_dirs=(tmp_path,),
        tenants=tenants,
        pool={"egress-open": 1},
    )
    fetch_both = FETCH_IN_REPL + "fetch('http://allowed.test/')[:5], fetch('http://other.test/')"
    async with Orchestrator(config, backend=egress_backend) as orch:
        with anyio.fail_after(180):
            while orch.pool_status()["egress-open"]["ready"] < 1:  # noqa: ASYNC110 (no event)
                await anyio.sleep(0.2)
            arguments = {"operation": "execute", "code": fetch_both, "policy": "egress-open"}
            capped = await orch.call("python_repl", arguments, tenant="capped")
            assert capped.structured["result_repr"] == "('hello', 403)", capped.structured
            assert capped.structured["network_denied"] == [
                {"host": "other.test", "port": 80, "rule": "allowlist"}
            ]
            free = await orch.call("python_repl", arguments, tenant="free")
            assert free.structured["result_repr"].startswith("('hello', 'hello other.test")
            sid = capped.structured["session_id"]
            wider = await orch.call(
                "session",
                {"operation": "set_allowlist", "session_id": sid, "allow": ["other.test"]},
                tenant="capped",
            )
            assert (wider.structured["error_type"], wider.structured.get("rule")) == (
                "policy", "tenant.egress_allow",
            )  # fmt: skip
            narrower = await orch.call(
                "session",
                {"operation": "set_allowlist", "session_id": sid, "allow": ["allowed.test:80"]},
                tenant="capped",
            )
            assert narrower.structured["allow"] == ["allowed.test:80"]
