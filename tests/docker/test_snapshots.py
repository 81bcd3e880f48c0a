"""Snapshots and forks through the session tool, against real containers: what a snapshot keeps
(files in /workspace, the home directory and /tmp, their modes and symlinks; env; metadata;
policy), what it does not (the REPL's memory: ``repl_state: fresh``), deleting one removes its
image, a restart keeps the list, quotas refuse, another tenant's id answers as an unknown one,
what a sandbox plants comes back as its own and no more, and MCP reaches it all (REST: through
the remote Sandbox API, tests/docker/test_sandbox_snapshots.py)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest
from mcp import Client

from orchestrator._api import Orchestrator
from orchestrator._core.snapshots import SNAPSHOT_REPOSITORY
from orchestrator._core.tenants import TenantConfig, TenantQuotas, hash_key, new_key
from orchestrator.backend.base import LABEL_SNAPSHOT, LABEL_SNAPSHOT_ORCHESTRATOR, SNAPSHOT_FILES
from orchestrator.images import ImageBuildResult
from orchestrator.mcp_server.server import build_mcp_server
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# A snapshot is two commits of a container; on a loaded 2-core machine each took up to 12 s.
SCENARIO_TIMEOUT = 240.0
POLICY = "unrestricted-python"
MIB = 1024 * 1024

WRITE_FILES = """
import os
os.makedirs('/workspace/d/e')
open('/workspace/a.txt', 'w').write('hello')
os.chmod('/workspace/a.txt', 0o600)
open('/workspace/d/e/f.bin', 'wb').write(bytes(range(256)) * 4)
os.symlink('a.txt', '/workspace/link')
open(os.path.expanduser('~/.rc'), 'w').write('home')
open('/tmp/t1', 'w').write('tmp')
kept_in_memory = 42
"""
READ_FILES = """
import os, stat
print(open('/workspace/a.txt').read(), oct(stat.S_IMODE(os.stat('/workspace/a.txt').st_mode)))
print(open('/workspace/d/e/f.bin', 'rb').read() == bytes(range(256)) * 4)
print(os.readlink('/workspace/link'), open(os.path.expanduser('~/.rc')).read())
print(open('/tmp/t1').read(), os.environ.get('SNAP_ENV'), os.getuid())
"""
FILES_READ_BACK = "hello 0o600\nTrue\na.txt home\ntmp kept 10001\n"


def tenant(name: str, **quotas: Any) -> TenantConfig:
    return TenantConfig(name=name, key_sha256=hash_key(new_key()), quotas=TenantQuotas(**quotas))


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def session_call(
    orch: Orchestrator, tenant: str | None = None, **args: Any
) -> dict[str, Any]:
    return (await orch.call("session", args, tenant=tenant)).structured


async def new_session(orch: Orchestrator, tenant: str | None = None, **args: Any) -> str:
    answer = await session_call(orch, tenant, operation="create", policy=POLICY, **args)
    assert answer["success"], answer
    return str(answer["session_id"])


async def run(orch: Orchestrator, sid: str, code: str, tenant: str | None = None) -> Any:
    return await orch.execute(code, session_id=sid, tenant=tenant)


async def snapshot(orch: Orchestrator, sid: str, tenant: str | None = None) -> dict[str, Any]:
    return await session_call(orch, tenant, operation="snapshot", session_id=sid)


def snapshot_images(orch: Orchestrator | str | None) -> list[str]:
    """The engine's snapshot images of this orchestrator (or orchestrator id), by tag."""
    own = orch.orchestrator_id if isinstance(orch, Orchestrator) else orch
    client = docker.from_env(timeout=30)
    try:
        filters = {"label": [LABEL_SNAPSHOT, f"{LABEL_SNAPSHOT_ORCHESTRATOR}={own}"]}
        return [t for image in client.api.images(filters=filters) for t in image["RepoTags"] or ()]
    finally:
        client.close()


def remove_images(orchestrator_id: str | None) -> None:
    client = docker.from_env(timeout=30)
    try:
        for tag in snapshot_images(orchestrator_id):
            client.api.remove_image(tag, force=True)
    finally:
        client.close()


async def test_a_session_made_from_a_snapshot_has_its_files_env_metadata_and_a_fresh_repl(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await new_session(orch, env={"SNAP_ENV": "kept"}, metadata={"stage": "one"})
        assert (await run(orch, sid, WRITE_FILES)).success
        taken = await snapshot(orch, sid)
        assert taken["success"], taken
        assert taken["repl_state"] == "fresh" and taken["policy"] == POLICY
        assert taken["keeps"] == ["filesystem", "policy", "metadata", "env"]
        assert taken["env_names"] == ["SNAP_ENV"] and "kept" not in str(taken)
        assert taken["metadata"] == {"stage": "one"} and taken["size_bytes"] >= 1024

        made = await session_call(
            orch, operation="create", snapshot=taken["snapshot_id"], metadata={"stage": "two"}
        )
        assert made["success"], made
        assert made["repl_state"] == "fresh" and made["policy"] == POLICY
        assert made["metadata"] == {"stage": "two"}
        copy = made["session_id"]
        assert copy != sid
        assert (await run(orch, copy, READ_FILES)).stdout == FILES_READ_BACK
        fresh = await run(orch, copy, "kept_in_memory")
        assert fresh.error_type == "NameError", fresh
        # The source goes on as it was, its memory included, and the two are apart.
        assert (await run(orch, sid, "print(kept_in_memory)")).stdout == "42\n"
        assert (await run(orch, copy, "open('/workspace/a.txt', 'w').write('changed')")).success
        assert (await run(orch, sid, "print(open('/workspace/a.txt').read())")).stdout == "hello\n"

        listed = await session_call(orch, operation="snapshots")
        assert [s["snapshot_id"] for s in listed["snapshots"]] == [taken["snapshot_id"]]
        other_policy = await session_call(
            orch, operation="create", snapshot=taken["snapshot_id"], policy="default"
        )
        assert other_policy["error_type"] == "invalid_argument", other_policy


async def test_a_fork_is_a_copy_whose_snapshot_goes_with_it(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await new_session(orch, env={"SNAP_ENV": "kept"})
        assert (await run(orch, sid, WRITE_FILES)).success
        forked = await session_call(orch, operation="fork", session_id=sid)
        assert forked["success"], forked
        assert forked["repl_state"] == "fresh" and forked["source_session"] == sid
        assert (await run(orch, forked["session_id"], READ_FILES)).stdout == FILES_READ_BACK
        assert (await session_call(orch, operation="snapshots"))["snapshots"] == []
        # Its image stays while the fork uses it, and goes at the first sweep after.
        assert len(snapshot_images(orch)) == 1
        assert await orch.destroy(forked["session_id"])
        await orch.snapshots.sweep()
        assert snapshot_images(orch) == []


async def test_deleting_a_snapshot_removes_its_image_and_its_id(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await new_session(orch)
        taken = await snapshot(orch, sid)
        assert snapshot_images(orch) == [f"{SNAPSHOT_REPOSITORY}:{taken['snapshot_id']}"]
        deleted = await session_call(
            orch, operation="delete_snapshot", snapshot=taken["snapshot_id"]
        )
        assert deleted == {**deleted, "deleted": True, "image_removed": True}
        assert snapshot_images(orch) == []
        for operation, args in (
            ("delete_snapshot", {"snapshot": taken["snapshot_id"]}),
            ("create", {"snapshot": taken["snapshot_id"]}),
        ):
            again = await session_call(orch, operation=operation, **args)
            assert again["error_type"] == "session_not_found", again


async def test_snapshots_survive_a_restart_of_the_orchestrator(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    settings = config(worker_image.tag, registry_path=tmp_path / "registry.db")
    try:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with Orchestrator(settings) as first:
                sid = await new_session(first, env={"SNAP_ENV": "kept"})
                assert (await run(first, sid, WRITE_FILES)).success
                taken = await snapshot(first, sid)
                assert taken["success"], taken
            async with Orchestrator(settings) as second:
                listed = await session_call(second, operation="snapshots")
                kept = {
                    k: v
                    for k, v in taken.items()
                    if k not in ("success", "operation", "session_id")
                }
                assert listed["snapshots"] == [kept]
                made = await session_call(second, operation="create", snapshot=taken["snapshot_id"])
                assert made["success"], made
                assert (await run(second, made["session_id"], READ_FILES)).stdout == FILES_READ_BACK
                deleted = await session_call(
                    second, operation="delete_snapshot", snapshot=taken["snapshot_id"]
                )
                assert deleted["success"], deleted
            assert snapshot_images(second) == []
    finally:
        # A registry on disk keeps its snapshots' images past the orchestrator: a failed run
        # must not leave them.
        remove_images(settings.orchestrator_id)


async def test_quotas_refuse_and_another_tenants_snapshot_is_an_unknown_one(
    worker_image: ImageBuildResult,
) -> None:
    tenants = {t.name: t for t in (tenant("alice", snapshots=1), tenant("bob", snapshots_mb=1))}
    async with Orchestrator(config(worker_image.tag, tenants=tenants)) as orch:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            alice = await new_session(orch, "alice")
            first = await snapshot(orch, alice, "alice")
            assert first["success"], first
            second = await snapshot(orch, alice, "alice")
            assert second["error_type"] == "quota_exceeded" and second["quota"] == "snapshots"

            bob = await new_session(orch, "bob")
            big = "import os\nopen('/workspace/big', 'wb').write(os.urandom(2 * 1024 * 1024))"
            assert (await run(orch, bob, big, "bob")).success
            too_big = await snapshot(orch, bob, "bob")
            assert too_big["error_type"] == "quota_exceeded", too_big
            assert too_big["quota"] == "snapshots_mb"
            assert snapshot_images(orch) == [f"{SNAPSHOT_REPOSITORY}:{first['snapshot_id']}"]

            # Bob is told of alice's snapshot what he is told of one that never was.
            unknown = f"snap-{secrets.token_hex(16)}"
            for sid in (first["snapshot_id"], unknown):
                for operation, args in (
                    ("create", {"snapshot": sid}),
                    ("delete_snapshot", {"snapshot": sid}),
                ):
                    answer = await session_call(orch, "bob", operation=operation, **args)
                    assert answer["error_type"] == "session_not_found", answer
                    assert answer["error_message"] == f"snapshot not found: {sid}"
            assert (await session_call(orch, "bob", operation="snapshots"))["snapshots"] == []
            assert snapshot_images(orch) == [f"{SNAPSHOT_REPOSITORY}:{first['snapshot_id']}"]


async def test_a_snapshot_of_a_policy_the_tenant_may_no_longer_use_is_refused(
    worker_image: ImageBuildResult,
) -> None:
    allowed = TenantConfig(
        name="carol", key_sha256=hash_key(new_key()), policies=(POLICY, "default")
    )
    async with Orchestrator(config(worker_image.tag, tenants={"carol": allowed})) as orch:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            sid = await new_session(orch, "carol")
            taken = await snapshot(orch, sid, "carol")
            assert taken["success"], taken
            await orch.reload(
                tenants={"carol": allowed.model_copy(update={"policies": ("default",)})}
            )
            refused = await session_call(
                orch, "carol", operation="create", snapshot=taken["snapshot_id"]
            )
            assert refused["error_type"] == "policy", refused


PLANT = """
import os
os.symlink('/etc/shadow', '/workspace/shadow')
os.symlink('/', '/workspace/root')
os.mkfifo('/workspace/pipe')
"""
PROBE = f"""
import os, stat
print(os.readlink('/workspace/shadow'), os.readlink('/workspace/root'))
print(stat.S_ISFIFO(os.stat('/workspace/pipe').st_mode))
try:
    open('/workspace/shadow').read()
except PermissionError:
    print('shadow refused')
archive = os.stat('{SNAPSHOT_FILES}')
print(archive.st_uid, oct(stat.S_IMODE(archive.st_mode)))
try:
    open('{SNAPSHOT_FILES}', 'ab')
except OSError as exc:
    print(type(exc).__name__)
"""


async def test_what_a_sandbox_plants_in_its_files_comes_back_as_its_own_and_no_more(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await new_session(orch)
        assert (await run(orch, sid, PLANT)).success
        taken = await snapshot(orch, sid)
        assert taken["success"], taken
        made = await session_call(orch, operation="create", snapshot=taken["snapshot_id"])
        probed = await run(orch, made["session_id"], PROBE)
        # Links are kept as links (never followed into what the host or root owns), the
        # archive in the image is root's and read-only to the sandbox.
        assert probed.stdout == (
            "/etc/shadow /\nTrue\nshadow refused\n0 0o444\nPermissionError\n"
        ), probed


async def test_a_file_the_sandbox_made_unreadable_is_named_and_nothing_is_kept(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = await new_session(orch)
        hide = (
            "import os\nopen('/workspace/hidden', 'w').write('x')\nos.chmod('/workspace/hidden', 0)"
        )
        assert (await run(orch, sid, hide)).success
        refused = await snapshot(orch, sid)
        assert refused["error_type"] == "invalid_argument", refused
        assert "workspace/hidden" in refused["error_message"]
        assert (await session_call(orch, operation="snapshots"))["snapshots"] == []
        assert snapshot_images(orch) == []


async def test_snapshot_fork_and_delete_through_mcp(orch: Orchestrator) -> None:
    server = build_mcp_server(orch, tenant=lambda: "local")
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with Client(server) as client:

            async def session_tool(**arguments: Any) -> dict[str, Any]:
                result = await client.call_tool("session", arguments)
                assert isinstance(result.structured_content, dict), result
                assert not result.is_error, result.structured_content
                return result.structured_content

            sid = (await session_tool(operation="create", policy=POLICY))["session_id"]
            assert (await run(orch, sid, WRITE_FILES)).success
            taken = await session_tool(operation="snapshot", session_id=sid)
            assert taken["repl_state"] == "fresh"
            listed = await session_tool(operation="snapshots")
            assert [s["snapshot_id"] for s in listed["snapshots"]] == [taken["snapshot_id"]]
            forked = await session_tool(operation="fork", session_id=sid)
            assert (
                await run(orch, forked["session_id"], "print(open('/tmp/t1').read())")
            ).stdout == ("tmp\n")
            await session_tool(operation="delete_snapshot", snapshot=taken["snapshot_id"])
            refused = await client.call_tool(
                "session", {"operation": "create", "snapshot": taken["snapshot_id"]}
            )
            assert refused.is_error and isinstance(refused.structured_content, dict)
            assert refused.structured_content["error_type"] == "session_not_found"


async def test_a_reconcile_running_while_a_snapshot_is_made_leaves_it_whole(
    worker_image: ImageBuildResult,
) -> None:
    # A reconcile every 0.1 s removes any container of the orchestrator's id it does not know:
    # the engine's work for a snapshot must not look like one, even for a snapshot of a session
    # made from a snapshot (whose image carries the labels of the first).
    async with Orchestrator(config(worker_image.tag, reap_interval=0.1)) as orch:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            sid = await new_session(orch)
            assert (await run(orch, sid, WRITE_FILES)).success
            first = await snapshot(orch, sid)
            assert first["success"], first
            made = await session_call(orch, operation="create", snapshot=first["snapshot_id"])
            second = await snapshot(orch, made["session_id"])
            assert second["success"], second
            again = await session_call(orch, operation="create", snapshot=second["snapshot_id"])
            assert again["success"], again
            read = await run(orch, again["session_id"], "print(open('/workspace/a.txt').read())")
            assert read.stdout == "hello\n"
            assert orch.last_reconcile.reaped == []
            assert len(orch.list_sessions()) == 3
