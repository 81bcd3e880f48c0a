"""E2B snapshots and forks through E2B's own SDK (pinned ``e2b``) against a real ``sandhold serve
--e2b-port`` (issue 29, snapshots and forks): a snapshot is listed, a sandbox made from it (its
id as the template) has the files and no process of the source, it is deleted once; a fork has
the source's files and is independent of it; another tenant neither sees nor uses a snapshot."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException, SandboxNotFoundException

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

pytestmark = pytest.mark.docker

# The processes of a sandbox, one command line each.
PROCESSES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
REQUEST_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-snap")) as running:
        yield running


def test_a_sandbox_made_from_a_snapshot_has_its_files_and_a_fresh_start(
    server: E2bServer,
) -> None:
    other = {"api_key": server.keys["team-b"]}
    source = Sandbox.create(timeout=600)
    try:
        source.files.write("/home/user/kept.txt", "kept before the snapshot")
        source.commands.run("sleep 600", background=True)
        snapshot = source.create_snapshot(name="prepared")
        assert snapshot.snapshot_id.endswith(":default")
        assert any("prepared" in name for name in snapshot.names)
        # Written after it: not in it.
        source.files.write("/home/user/later.txt", "after")
        listed = Sandbox.list_snapshots().next_items()
        assert snapshot.snapshot_id in [s.snapshot_id for s in listed]
        by_sandbox = Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        assert [s.snapshot_id for s in by_sandbox] == [snapshot.snapshot_id]
        assert Sandbox.list_snapshots(name="prepared-not").next_items() == []

        # Another tenant: not listed, not usable as a template, not deletable.
        assert Sandbox.list_snapshots(**other).next_items() == []
        # Answered as a template that never was (E2B's 404, which the SDK raises as such).
        with pytest.raises(SandboxException, match=r"^404: template .* not found"):
            Sandbox.create(snapshot.snapshot_id, **other)
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **other) is False

        made = Sandbox.create(snapshot.snapshot_id, timeout=600)
        try:
            assert made.sandbox_id != source.sandbox_id
            assert made.files.read("/home/user/kept.txt") == "kept before the snapshot"
            assert not made.files.exists("/home/user/later.txt")
            # No process of the source's: the snapshot keeps files, not memory.
            assert "sleep 600" in source.commands.run(PROCESSES).stdout
            assert "sleep 600" not in made.commands.run(PROCESSES).stdout
            made.files.write("/home/user/kept.txt", "changed in the copy")
            assert source.files.read("/home/user/kept.txt") == "kept before the snapshot"
        finally:
            made.kill()
    finally:
        source.kill()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    with pytest.raises(SandboxException, match=r"^404: template .* not found"):
        Sandbox.create(snapshot.snapshot_id)


def test_a_fork_has_the_files_of_the_running_sandbox_and_goes_its_own_way(
    server: E2bServer,
) -> None:
    source = Sandbox.create(timeout=600)
    try:
        source.files.write("/home/user/state.txt", "before the fork")
        with pytest.raises(SandboxNotFoundException):
            Sandbox.fork(source.sandbox_id, api_key=server.keys["team-b"])
        forks = source.fork(timeout=600)
        assert len(forks) == 1
        fork = forks[0]
        assert isinstance(fork, Sandbox)
        try:
            assert fork.sandbox_id != source.sandbox_id
            assert source.is_running() and fork.is_running()
            assert fork.files.read("/home/user/state.txt") == "before the fork"
            fork.files.write("/home/user/state.txt", "in the fork")
            assert source.files.read("/home/user/state.txt") == "before the fork"
        finally:
            fork.kill()
        # The fork's snapshot went once the fork existed.
        assert Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items() == []
    finally:
        source.kill()


def test_a_filesystem_only_snapshot_is_answered_as_what_every_snapshot_keeps(
    server: E2bServer,
) -> None:
    source = Sandbox.create(timeout=600)
    headers = {"X-API-Key": server.keys["team-a"]}
    try:
        with httpx.Client(base_url=server.url, headers=headers, timeout=REQUEST_TIMEOUT) as http:
            answer = http.post(f"/sandboxes/{source.sandbox_id}/snapshots", json={"memory": False})
            assert answer.status_code == 201, answer.text
            taken = answer.json()
            assert taken["replState"] == "fresh"
            assert "filesystem" in taken["keeps"]
            bad = http.post(f"/sandboxes/{source.sandbox_id}/snapshots", json={"memory": "no"})
            assert bad.status_code == 400
            bad_fork = http.post(f"/sandboxes/{source.sandbox_id}/fork", json={"count": 21})
            assert bad_fork.status_code == 400
            assert http.delete(f"/templates/{taken['snapshotID']}").status_code == 204
    finally:
        source.kill()


@pytest.fixture(scope="module")
def one_snapshot_server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(
        worker_image.tag,
        tmp_path_factory.mktemp("e2b-snap-quota"),
        set_env=False,
        quotas={"snapshots": 1},
    ) as running:
        yield running


def test_a_snapshot_past_the_tenants_quota_is_e2bs_rate_limit(
    one_snapshot_server: E2bServer,
) -> None:
    """The core's ``quota_exceeded`` through the front door's E2B_STATUS: 429, which the SDK
    raises as ``RateLimitException``; the first snapshot is untouched."""
    options = {"api_key": one_snapshot_server.keys["team-a"], "api_url": one_snapshot_server.url,
               "sandbox_url": one_snapshot_server.url}  # fmt: skip
    source = Sandbox.create(timeout=600, **options)
    try:
        first = source.create_snapshot()
        try:
            with pytest.raises(RateLimitException, match="quota_exceeded"):
                source.create_snapshot()
            with pytest.raises(RateLimitException, match="quota_exceeded"):
                source.fork()
            listed = Sandbox.list_snapshots(**options).next_items()
            assert [s.snapshot_id for s in listed] == [first.snapshot_id]
        finally:
            Sandbox.delete_snapshot(first.snapshot_id, **options)
    finally:
        source.kill()
