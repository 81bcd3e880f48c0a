"""The snapshot bookkeeping on the in-memory backend (pure logic: what the files are and how they
come back is tested against real containers in tests/docker/test_snapshots.py): quotas refuse
before anything is kept and leave no image, a backend that makes no images says not_supported,
another tenant's id reads as an unknown one, the sweep removes only unnamed unused images, and
the registry keeps snapshots across a reopen."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from orchestrator._core.snapshots import ARCHIVE_SCRIPT, MIB, Snapshots
from orchestrator._core.tenants import TenantConfig, TenantQuotas, hash_key, new_key
from orchestrator.backend.base import LABEL_SNAPSHOT, LABEL_SNAPSHOT_ORCHESTRATOR, ContainerSpec
from orchestrator.backend.fake import FakeBackend, FakeProcess
from orchestrator.errors import NotSupportedError, QuotaExceededError, SessionNotFoundError
from orchestrator.policy.model import load_policy
from orchestrator.registry.store import Registry, SnapshotRecord
from orchestrator.session.session import Session

pytestmark = pytest.mark.anyio

ORCHESTRATOR = "unit-orchestrator"
# Every step here is in memory.
STEP_TIMEOUT = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def registry() -> Iterator[Registry]:
    store = Registry()
    store.open()
    yield store
    store.close()


def archive_of(size: int) -> Callable[[FakeProcess], int]:
    def archive(process: FakeProcess) -> int:
        process.write(b"x" * size)
        return 0

    return archive


def snapshots_for(
    backend: FakeBackend, registry: Registry, **quotas: int
) -> tuple[Snapshots, dict[str, TenantConfig]]:
    tenants = {
        "alice": TenantConfig(
            name="alice", key_sha256=hash_key(new_key()), quotas=TenantQuotas(**quotas)
        )
    }
    made = Snapshots(
        backend,
        registry=lambda: registry,
        tenant_config=tenants.get,
        orchestrator_id=lambda: ORCHESTRATOR,
        extra_labels={},
    )
    return made, tenants


async def session_of(backend: FakeBackend, tenant: str = "alice") -> Session:
    policy = load_policy("default")
    session_id = secrets.token_hex(16)
    spec = ContainerSpec(
        image="fake-image",
        policy=policy,
        session_id=session_id,
        tenant=tenant,
        orchestrator_id=ORCHESTRATOR,
    )
    container_id = await backend.create_container(spec)
    return Session.assemble(
        backend, session_id=session_id, tenant=tenant, policy=policy, container_id=container_id
    )


async def test_the_count_quota_refuses_the_snapshot_past_it_and_keeps_nothing(
    registry: Registry,
) -> None:
    backend = FakeBackend()
    backend.program(["sh", "-c", ARCHIVE_SCRIPT], archive_of(1024))
    snapshots, _ = snapshots_for(backend, registry, snapshots=1)
    session = await session_of(backend)
    with anyio.fail_after(STEP_TIMEOUT):
        first = await snapshots.take(session, task=None)
        with pytest.raises(QuotaExceededError) as refused:
            await snapshots.take(session, task=None)
    assert refused.value.quota == "snapshots"
    assert [r.id for r in registry.snapshots()] == [first["snapshot_id"]]
    assert len(backend.images) == 1


async def test_files_past_the_size_quota_are_refused_and_leave_no_image(
    registry: Registry,
) -> None:
    backend = FakeBackend()
    backend.program(["sh", "-c", ARCHIVE_SCRIPT], archive_of(2 * MIB))
    snapshots, _ = snapshots_for(backend, registry, snapshots_mb=1)
    session = await session_of(backend)
    with anyio.fail_after(STEP_TIMEOUT), pytest.raises(QuotaExceededError) as refused:
        await snapshots.take(session, task=None)
    assert refused.value.quota == "snapshots_mb"
    assert registry.snapshots() == [] and backend.images == {}


async def test_a_backend_that_makes_no_images_says_not_supported(registry: Registry) -> None:
    backend = FakeBackend(snapshots=False)
    backend.program(["sh", "-c", ARCHIVE_SCRIPT], archive_of(10))
    snapshots, _ = snapshots_for(backend, registry)
    session = await session_of(backend)
    with anyio.fail_after(STEP_TIMEOUT), pytest.raises(NotSupportedError) as refused:
        await snapshots.take(session, task=None)
    assert refused.value.to_dict()["error_type"] == "not_supported"
    assert registry.snapshots() == []
    assert await snapshots.sweep() == []


async def test_another_tenants_snapshot_reads_as_an_unknown_one(registry: Registry) -> None:
    backend = FakeBackend()
    backend.program(["sh", "-c", ARCHIVE_SCRIPT], archive_of(10))
    snapshots, _ = snapshots_for(backend, registry)
    with anyio.fail_after(STEP_TIMEOUT):
        taken = await snapshots.take(await session_of(backend), task=None)
    unknown = f"snap-{secrets.token_hex(16)}"
    answers = []
    for snapshot_id in (taken["snapshot_id"], unknown):
        with pytest.raises(SessionNotFoundError) as refused:
            snapshots.find(snapshot_id, "mallory")
        answers.append(str(refused.value).replace(snapshot_id, "<id>"))
    assert answers[0] == answers[1]
    assert snapshots.listed("mallory") == []
    assert [s["snapshot_id"] for s in snapshots.listed("alice")] == [taken["snapshot_id"]]


async def test_the_sweep_removes_only_unnamed_images_no_container_uses(
    registry: Registry,
) -> None:
    backend = FakeBackend()
    snapshots, _ = snapshots_for(backend, registry)
    container = await session_of(backend)
    ours = {LABEL_SNAPSHOT: "x", LABEL_SNAPSHOT_ORCHESTRATOR: ORCHESTRATOR}
    for reference in ("named", "unnamed", "in-use"):
        await backend.commit_container(container.container_id, reference=reference, labels=ours)
    await backend.commit_container(
        container.container_id,
        reference="another-orchestrators",
        labels={LABEL_SNAPSHOT: "y", LABEL_SNAPSHOT_ORCHESTRATOR: "someone-else"},
    )
    registry.add_snapshot(record("named"))
    spec = ContainerSpec(
        image="in-use",
        policy=load_policy("default"),
        session_id=secrets.token_hex(16),
        tenant="alice",
        orchestrator_id=ORCHESTRATOR,
    )
    await backend.create_container(spec)
    with anyio.fail_after(STEP_TIMEOUT):
        assert await snapshots.sweep() == ["unnamed"]
    assert set(backend.images) == {"named", "in-use", "another-orchestrators"}


def record(image: str, *, tenant: str = "alice") -> SnapshotRecord:
    return SnapshotRecord(
        id=f"snap-{secrets.token_hex(16)}",
        tenant=tenant,
        task=None,
        policy="default",
        image=image,
        size_bytes=10,
        env={"TOKEN": "s3cret"},
        metadata={"k": "v"},
        source_session=secrets.token_hex(16),
        created_at="2026-12-01T00:00:00+00:00",
    )


def test_the_registry_keeps_snapshots_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    first = Registry(path)
    first.open()
    kept = record("an-image")
    first.add_snapshot(kept)
    first.add_snapshot(record("another", tenant="bob"))
    first.close()
    second = Registry(path)
    second.open()
    try:
        assert second.snapshots("alice") == [kept]
        assert len(second.snapshots()) == 2
        assert second.remove_snapshot(kept.id) is True
        assert second.remove_snapshot(kept.id) is False
        assert second.snapshots("alice") == []
    finally:
        second.close()
