"""E2B lifecycles and listings through E2B's own SDK (pinned ``e2b``) against a real ``sandhold
serve --e2b-port`` (issue 29, lifecycle and listing): a sandbox made to pause at its timeout is
paused by the core's reaper and is not running for its data plane until ``connect`` resumes it;
with ``auto_resume`` the next request wakes it; the lifecycle is answered back by ``get_info``;
listings are newest first, paginated, filtered by state, metadata and ``startedAfter``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

pytestmark = pytest.mark.docker

# A sandbox with a 3 s lifetime is paused within this: the core's reaper runs at least every
# 30 s; the rest is room for a loaded machine. Only an upper bound on a wait.
EXPIRY_WAIT = 90.0


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-life")) as running:
        yield running


def wait_until_paused(sandbox: Sandbox) -> None:
    deadline = time.monotonic() + EXPIRY_WAIT
    while sandbox.get_info().state != SandboxState.PAUSED and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sandbox.get_info().state == SandboxState.PAUSED


def test_a_sandbox_paused_at_its_timeout_waits_for_connect(server: E2bServer) -> None:
    made = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        made.commands.run("echo kept > kept.txt")
        info = made.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": False}
        wait_until_paused(made)
        assert not made.is_running()  # its data plane answers as for a sandbox not running
        assert made.get_info().state == SandboxState.PAUSED  # and the request did not wake it
        resumed = Sandbox.connect(made.sandbox_id)
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.is_running()
        assert resumed.commands.run("cat kept.txt").stdout == "kept\n"
    finally:
        made.kill()


def test_auto_resume_wakes_a_paused_sandbox_on_its_next_request(server: E2bServer) -> None:
    made = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        made.commands.run("echo kept > kept.txt")
        assert made.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        wait_until_paused(made)
        assert made.commands.run("cat kept.txt").stdout == "kept\n"
        info = made.get_info()
        assert info.state == SandboxState.RUNNING
        # The resume gave it its lifetime again, from now.
        assert info.end_at.timestamp() > time.time()
    finally:
        made.kill()


def test_a_sandbox_without_a_pause_lifecycle_says_it_is_killed_at_its_end(
    server: E2bServer,
) -> None:
    made = Sandbox.create(timeout=120)
    try:
        assert made.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}
    finally:
        made.kill()


def test_listings_are_newest_first_paginated_and_filtered(server: E2bServer) -> None:
    run = str(uuid.uuid4())
    made = [Sandbox.create(metadata={"run": run, "n": str(n)}) for n in range(3)]
    try:
        query = SandboxQuery(metadata={"run": run})
        pages = Sandbox.list(query=query, limit=2)
        first = pages.next_items()
        assert pages.has_next and pages.next_token
        second = pages.next_items()
        assert not pages.has_next and pages.next_token is None
        newest_first = [s.sandbox_id for s in reversed(made)]
        assert [s.sandbox_id for s in first + second] == newest_first
        made[1].pause()
        paused = Sandbox.list(
            query=SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED])
        )
        assert [s.sandbox_id for s in paused.next_items()] == [made[1].sandbox_id]
        running = Sandbox.list(
            query=SandboxQuery(metadata={"run": run}, state=[SandboxState.RUNNING])
        ).next_items()
        assert {s.sandbox_id for s in running} == {made[0].sandbox_id, made[2].sandbox_id}
        # E2B's v2 listing by hand: oldest first on request, and only those started at or after
        # a time (E2B's startedAfter includes it).
        since = made[1].get_info().started_at.isoformat()
        headers = {"X-API-Key": server.keys["team-a"]}
        params = {"metadata": f"run={run}", "order": "asc", "startedAfter": since}
        answer = httpx.get(f"{server.url}/v2/sandboxes", params=params, headers=headers)
        assert answer.status_code == 200, answer.text
        assert [s["sandboxID"] for s in answer.json()] == [made[1].sandbox_id, made[2].sandbox_id]
        bad = httpx.get(f"{server.url}/v2/sandboxes", params={"order": "up"}, headers=headers)
        assert bad.status_code == 400 and "order" in bad.json()["message"]
    finally:
        for sandbox in made:
            sandbox.kill()
