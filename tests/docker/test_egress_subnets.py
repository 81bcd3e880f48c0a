"""Session networks carved from the operator's subnet pool (``SANDHOLD_EGRESS_SUBNETS``), against
the real engine: sessions created at once get distinct subnets inside the pool, a full pool is a
clear ``backend_unavailable``, and a freed subnet is taken again."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio
import docker
import pytest

from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.docker import DockerBackend, DockerClient, EgressSettings
from orchestrator.backend.docker._egress_subnets import free_subnets
from orchestrator.errors import BackendUnavailableError
from orchestrator.policy.model import Policy
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.docker.test_egress import _egress_of, own_upstream

__all__ = ["own_upstream"]  # the fixture, from test_egress

pytestmark = pytest.mark.anyio

# A /26: four session networks. In a range Docker's default pools never use.
POOL = "10.213.7.0/26"


def _engine_subnets() -> list[str]:
    sdk = docker.from_env(timeout=30)
    try:
        return [
            c["Subnet"]
            for n in sdk.api.networks()
            for c in ((n.get("IPAM") or {}).get("Config") or [])
            if c.get("Subnet")
        ]
    finally:
        sdk.close()


def _subnet_of(session_id: str) -> str:
    """The pool's subnet the session took: its two networks (``_egress_net``) hold one half
    each, the session network the first."""
    sdk = docker.from_env(timeout=30)
    try:
        found = {
            net["Driver"]: ipaddress.ip_network(
                sdk.api.inspect_network(net["Id"])["IPAM"]["Config"][0]["Subnet"]
            )
            for net in sdk.api.networks(filters={"label": f"sandhold.egress-session={session_id}"})
        }
    finally:
        sdk.close()
    session, link = found.pop("macvlan"), found.pop("bridge")
    assert found == {} and session.prefixlen == link.prefixlen == 29
    assert session.supernet() == link.supernet() and session < link
    return str(session.supernet())


@pytest.fixture
async def backend(own_upstream: str) -> AsyncIterator[DockerBackend]:
    client = DockerClient()
    try:
        settings = EgressSettings(upstream_network=own_upstream, subnet_pool=POOL)
        yield DockerBackend(client, egress=settings)
    finally:
        await client.aclose()


async def test_sessions_get_distinct_subnets_of_the_pool_until_it_is_full(
    backend: DockerBackend, worker_image: Any
) -> None:
    capacity = len(list(free_subnets(POOL, _engine_subnets())))
    assert capacity >= 2, f"the test's pool {POOL} is taken on this engine: pick another"
    made: dict[str, str] = {}  # session id -> container id
    tried: list[str] = []

    async def create() -> str:
        session_id = secrets.token_hex(16)
        tried.append(session_id)
        spec = ContainerSpec(
            image=worker_image.tag, policy=Policy.model_validate(
                {"name": "egress-pool", "network": {"mode": "open"}}
            ),
            session_id=session_id, tenant="test", orchestrator_id=TEST_ORCHESTRATOR_ID,
            extra_labels={TEST_RUN_LABEL: RUN_ID},
        )  # fmt: skip
        made[session_id] = await backend.create_container(spec)
        return session_id

    try:
        with anyio.fail_after(180):
            async with anyio.create_task_group() as group:
                for _ in range(capacity):
                    group.start_soon(create)
            subnets = {sid: _subnet_of(sid) for sid in made}
            assert len(set(subnets.values())) == capacity
            pool = ipaddress.ip_network(POOL)
            assert all(ipaddress.ip_network(s).subnet_of(pool) for s in subnets.values())
            with pytest.raises(BackendUnavailableError, match=r"pool .* is full"):
                await create()
            assert _egress_of(tried[-1]) == ([], [])  # the refused one left nothing behind
            freed_session, freed_container = next(iter(made.items()))
            await backend.remove_container(freed_container)
            del made[freed_session]
            again = await create()
            assert _subnet_of(again) == subnets[freed_session]
    finally:
        with anyio.CancelScope(shield=True):
            for container_id in made.values():
                await backend.remove_container(container_id)
