"""E2B sandboxes survive ``kill -9`` of ``sandhold serve`` (issue 28 item 3): a sandbox made
through E2B's SDK (pinned ``e2b``), with metadata and a timeout, is found after the server is
killed and started again on the same data directory: ``Sandbox.connect(id)`` runs a command in
the same container (a file written before the kill is there), and ``get_info`` answers the same
metadata and the same end. A REST session keeps its metadata and lifetime the same way."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxException, SandboxState, Template

from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.docker.e2b_server import (
    STOP_TIMEOUT,
    _read_until_e2b_line,
    _tenants_file,
    e2b_key,
)

pytestmark = pytest.mark.docker

# The wall clock's end, as answered before and after a restart: the two conversions (monotonic
# to wall clock and back) may each move it by a little; a lost end would be minutes off.
END_SLACK_S = 5.0
# A REST session's lifetime, set before the kill; the wait for its end after it is bounded by
# this and the core reaper's longest round (30 s) with room for a loaded machine.
LIFETIME_S = 20
END_WAIT_S = 90


@dataclass
class Serve:
    """One ``sandhold serve --e2b-port 0`` process: what the next start of the same server needs."""

    tmp: Path
    keys: dict[str, str]
    orchestrator_id: str
    process: subprocess.Popen[str] | None = None
    e2b_url: str = ""
    rest_url: str = ""

    def start(self) -> None:
        env = {
            **os.environ,
            "SANDHOLD_IMAGE": os.environ["SANDHOLD_TEST_IMAGE"],
            "SANDHOLD_ORCHESTRATOR_ID": self.orchestrator_id,
            "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
            "SANDHOLD_DATA_DIR": str(self.tmp / "data"),
        }
        tenants = str(self.tmp / "tenants.toml")
        command = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1",
                   "--port", "0", "--e2b-port", "0", "--tenants", tenants]  # fmt: skip
        with (self.tmp / "serve.stderr").open("a") as stderr:
            self.process = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.e2b_url, self.rest_url = _read_until_e2b_line(self.process)

    def kill_9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT)

    def stop(self) -> None:
        """SIGTERM (bounded, then killed): the server ends every session it holds."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)

    def sdk(self) -> dict[str, str]:
        return {"api_key": self.keys["team-a"], "api_url": self.e2b_url,
                "sandbox_url": self.e2b_url}  # fmt: skip


@pytest.fixture
def serve(worker_image: ImageBuildResult, tmp_path: Path) -> Iterator[Serve]:
    keys = {"team-a": e2b_key()}
    _tenants_file(tmp_path / "tenants.toml", keys)
    os.environ["SANDHOLD_TEST_IMAGE"] = worker_image.tag
    server = Serve(tmp_path, keys, f"test-e2b-restart-{RUN_ID}-{secrets.token_hex(4)}")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_sandbox_outlives_kill_9_of_serve_with_its_files_metadata_and_timeout(
    serve: Serve,
) -> None:
    made = Sandbox.create(metadata={"owner": "restart-test", "n": "7"}, timeout=600, **serve.sdk())
    made.commands.run("echo before-the-kill > kept.txt")
    made.set_timeout(900)
    before = made.get_info()
    assert before.metadata == {"owner": "restart-test", "n": "7"}

    serve.kill_9()
    serve.start()

    again = Sandbox.connect(made.sandbox_id, **serve.sdk())
    assert again.sandbox_id == made.sandbox_id
    assert again.commands.run("cat kept.txt").stdout == "before-the-kill\n"
    after = again.get_info()
    assert after.metadata == before.metadata
    assert after.state == SandboxState.RUNNING
    assert abs((after.end_at - before.end_at).total_seconds()) <= END_SLACK_S
    assert after.started_at == before.started_at
    listed = Sandbox.list(**serve.sdk()).next_items()
    assert [s.sandbox_id for s in listed] == [made.sandbox_id]
    # The pids of commands started before the kill are not given out again.
    handle = again.commands.run("sleep 60", background=True)
    assert handle.pid > 1000
    assert again.kill() is True


def test_a_sandbox_set_to_pause_at_its_end_keeps_that_across_a_restart(serve: Serve) -> None:
    made = Sandbox.create(timeout=600, lifecycle={"on_timeout": "pause"}, **serve.sdk())
    try:
        serve.kill_9()
        serve.start()
        info = Sandbox.get_info(made.sandbox_id, **serve.sdk())
        assert info.lifecycle is not None and info.lifecycle["on_timeout"] == "pause"
    finally:
        with contextlib.suppress(Exception):
            Sandbox.kill(made.sandbox_id, **serve.sdk())


def test_a_rest_session_keeps_its_metadata_and_lifetime_across_kill_9(serve: Serve) -> None:
    headers = {"Authorization": f"Bearer {serve.keys['team-a']}"}

    def session_call(http: httpx.Client, **arguments: object) -> dict[str, object]:
        answer = http.post("/v1/session", json=arguments)
        assert answer.status_code == 200, answer.text
        fields: dict[str, object] = answer.json()
        return fields

    with httpx.Client(base_url=serve.rest_url, headers=headers, timeout=120) as http:
        made = session_call(http, operation="create", metadata={"job": "nightly"})
        session_id = made["session_id"]
        session_call(http, operation="set_timeout", session_id=session_id, timeout_s=LIFETIME_S)
    serve.kill_9()
    serve.start()
    with httpx.Client(base_url=serve.rest_url, headers=headers, timeout=120) as http:
        listed = http.get("/v1/sessions").json()["sessions"]
        (session,) = [s for s in listed if s["session_id"] == session_id]
        assert session["metadata"] == {"job": "nightly"}
        # Its end is the one set before the kill (its policy would give it hours): it ends,
        # and says why, within the reaper's round after it.
        deadline = time.monotonic() + LIFETIME_S + END_WAIT_S
        while time.monotonic() < deadline:
            ran = http.post(f"/v1/sessions/{session_id}/execute", json={"code": "1"}).json()
            if ran.get("error_type") == "session_not_found":
                break
            time.sleep(1)
        assert ran.get("error_type") == "session_not_found", ran
        assert "set_timeout" in str(ran.get("error_message")), ran


def test_a_sandbox_of_a_template_build_is_adopted_with_its_image_after_kill_9(
    serve: Serve,
) -> None:
    """A sandbox made from a build (the templates test's jq steps: cached) runs the build's
    image; after kill -9 its container is adopted as it is (the build, in memory, is gone, and
    with it a new create of the name)."""
    steps = Template().from_template("base").apt_install("jq").run_cmd("jq --version")
    api = {k: v for k, v in serve.sdk().items() if k != "sandbox_url"}
    Template.build(steps, "jq-restart", **api)
    made = Sandbox.create("jq-restart", timeout=600, **serve.sdk())
    try:
        serve.kill_9()
        serve.start()
        again = Sandbox.connect(made.sandbox_id, **serve.sdk())
        assert again.commands.run("jq -n '[1, 2] | add'").stdout == "3\n"
        assert again.get_info().template_id == "jq-restart"
        with pytest.raises(SandboxException, match="404"):
            Sandbox.create("jq-restart", **serve.sdk())
    finally:
        with contextlib.suppress(Exception):
            Sandbox.kill(made.sandbox_id, **serve.sdk())
