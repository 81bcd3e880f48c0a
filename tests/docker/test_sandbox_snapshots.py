"""Snapshots and forks through the typed sandbox API, in-process and remote (REST), and through
the blocking twin: a snapshot's files, env and metadata come back in a sandbox made from it
(its REPL fresh), a fork copies a sandbox, another tenant cannot use or see a snapshot, and a
deleted one is gone."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from orchestrator import AsyncSandbox, Sandbox, SessionNotFoundError, SyncOrchestrator
from orchestrator.images import ImageBuildResult
from orchestrator.sandbox import SnapshotInfo
from tests.docker.test_http_api import KEY_B
from tests.docker.test_python_repl import config
from tests.docker.test_sandbox_api import POLICY, Sandhold, sandhold

pytestmark = [pytest.mark.docker]

__all__ = ["sandhold"]  # the fixture, local and remote

# Two snapshots (two commits each, up to 12 s each on a loaded 2-core machine) and four sessions.
SCENARIO_TIMEOUT = 240
WRITE = "open('/workspace/kept.txt', 'w').write('kept')\nvalue = 7"
READ = "import os\nprint(open('/workspace/kept.txt').read(), os.environ['MODE'])"


@pytest.mark.anyio
async def test_snapshot_create_from_it_fork_and_delete_through_the_async_sandbox(
    sandhold: Sandhold,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        options = sandhold.options()
        made = AsyncSandbox.create(policy=POLICY, env={"MODE": "x"}, metadata={"k": "v"}, **options)
        async with made as sandbox:
            assert (await sandbox.run_code(WRITE)).error is None
            taken = await sandbox.snapshot()
            assert isinstance(taken, SnapshotInfo)
            assert taken.repl_state == "fresh" and taken.env_names == ["MODE"]
            assert taken.metadata == {"k": "v"} and taken.policy == POLICY
            assert [s.snapshot_id for s in await AsyncSandbox.list_snapshots(**options)] == [
                taken.snapshot_id
            ]
            async with AsyncSandbox.create(snapshot=taken, **options) as copy:
                assert copy.metadata == {"k": "v"}
                assert (await copy.run_code(READ)).stdout == "kept x\n"
                fresh = await copy.run_code("value")
                assert fresh.error is not None and fresh.error.name == "NameError"
            forked = await sandbox.fork()
            try:
                assert (await forked.run_code(READ)).stdout == "kept x\n"
            finally:
                await forked.aclose()

            other = sandhold.options(KEY_B)
            assert await AsyncSandbox.list_snapshots(**other) == []
            with pytest.raises(SessionNotFoundError):
                await AsyncSandbox.create(snapshot=taken.snapshot_id, **other)
            with pytest.raises(SessionNotFoundError):
                await AsyncSandbox.delete_snapshot(taken, **other)

            assert await AsyncSandbox.delete_snapshot(taken, **options) is True
            assert await AsyncSandbox.list_snapshots(**options) == []
            with pytest.raises(SessionNotFoundError):
                await AsyncSandbox.create(snapshot=taken, **options)


@pytest.fixture
def sync_sandhold(worker_image: ImageBuildResult) -> Iterator[SyncOrchestrator]:
    with SyncOrchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


@pytest.mark.timeout(300)
def test_snapshot_and_fork_through_the_blocking_twin(sync_sandhold: SyncOrchestrator) -> None:
    with Sandbox.create(orchestrator=sync_sandhold, policy=POLICY, env={"MODE": "y"}) as sandbox:
        assert sandbox.run_code(WRITE).error is None
        with sandbox.fork() as forked:
            assert forked.run_code(READ).stdout == "kept y\n"
        taken = sandbox.snapshot()
        listed = Sandbox.list_snapshots(orchestrator=sync_sandhold)
        assert [s.snapshot_id for s in listed] == [taken.snapshot_id]
        with Sandbox.create(orchestrator=sync_sandhold, snapshot=taken) as copy:
            assert copy.run_code(READ).stdout == "kept y\n"
        assert Sandbox.delete_snapshot(taken, orchestrator=sync_sandhold) is True
        assert Sandbox.list_snapshots(orchestrator=sync_sandhold) == []
