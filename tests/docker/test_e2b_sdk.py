"""E2B's own SDK (``e2b`` 2.63, pinned), unmodified, drives a real ``sandhold serve --e2b-port``
through exactly the three variables a client sets: sandboxes made, found, listed by metadata,
given a new lifetime and killed; commands with exit codes, stderr, envs, cwd, timeouts, stdin
and background kills; files written, read, listed, moved and removed; and one tenant's
sandbox invisible to another's key."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest
from e2b import (
    CommandExitException,
    FileType,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

pytestmark = pytest.mark.docker

# A sandbox with a 3 s lifetime is reported gone or paused within this: the server's reaper
# runs every second; the rest is room for a loaded machine. Only an upper bound on a wait.
EXPIRY_WAIT = 60.0


def wait_until_not_running(sandbox: Sandbox) -> None:
    deadline = time.monotonic() + EXPIRY_WAIT
    while sandbox.is_running() and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b")) as running:
        yield running


@pytest.fixture
def sandbox(server: E2bServer) -> Iterator[Sandbox]:
    made = Sandbox.create()
    try:
        yield made
    finally:
        made.kill()


def test_a_sandbox_is_created_found_listed_by_metadata_given_a_timeout_and_killed(
    server: E2bServer,
) -> None:
    made = Sandbox.create(metadata={"run": "e2b-test", "n": "1"}, timeout=120)
    other = Sandbox.create(metadata={"run": "e2b-test", "n": "2"})
    try:
        info = made.get_info()
        assert info.sandbox_id == made.sandbox_id and info.template_id == "base"
        assert info.metadata == {"run": "e2b-test", "n": "1"}
        assert 110 <= (info.end_at - info.started_at).total_seconds() <= 120
        listed = Sandbox.list(query=SandboxQuery(metadata={"n": "1"})).next_items()
        assert [s.sandbox_id for s in listed] == [made.sandbox_id]
        both = Sandbox.list(query=SandboxQuery(metadata={"run": "e2b-test"})).next_items()
        assert {s.sandbox_id for s in both} == {made.sandbox_id, other.sandbox_id}
        made.set_timeout(1000)
        longer = made.get_info()
        assert (longer.end_at - info.end_at).total_seconds() > 800
        again = Sandbox.connect(made.sandbox_id)
        assert again.commands.run("echo connected").stdout == "connected\n"
        assert made.is_running()
    finally:
        assert made.kill() is True
        other.kill()
    assert Sandbox.kill(made.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(made.sandbox_id)
    listed = Sandbox.list(query=SandboxQuery(metadata={"run": "e2b-test"})).next_items()
    assert listed == []


def test_an_unknown_template_is_refused_as_not_found(server: E2bServer) -> None:
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(template="no-such-template")


def test_a_command_reports_its_output_streams_exit_code_envs_and_cwd(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("sub")
    ran = sandbox.commands.run(
        'echo out; echo err >&2; echo "$GREETING"; pwd',
        envs={"GREETING": "hello"},
        cwd="/home/user/sub",
    )
    assert ran.exit_code == 0
    assert ran.stdout == "out\nhello\n/workspace/sub\n"
    assert ran.stderr == "err\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo why >&2; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stderr == "why\n"


def test_sandbox_envs_reach_every_command(server: E2bServer) -> None:
    made = Sandbox.create(envs={"FROM_CREATE": "yes"})
    try:
        assert made.commands.run("echo $FROM_CREATE").stdout == "yes\n"
    finally:
        made.kill()


def test_a_command_past_its_timeout_raises_timeout(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=2)


def test_a_background_command_is_listed_fed_stdin_and_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run(
        "read line; echo got:$line; sleep 300", background=True, stdin=True
    )
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    sandbox.commands.send_stdin(handle.pid, "ping\n")
    for stdout, _, _ in handle:
        if stdout and "got:ping" in stdout:
            break
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def test_files_are_written_read_listed_moved_and_removed(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/a.txt", "text one")
    assert info.path == "/home/user/notes/a.txt"
    sandbox.files.write("/home/user/b.bin", b"\x00\xffbytes")
    sandbox.files.write("c.txt", io.BytesIO(b"from a stream"))
    assert sandbox.files.read("notes/a.txt") == "text one"
    assert bytes(sandbox.files.read("b.bin", format="bytes")) == b"\x00\xffbytes"
    assert sandbox.files.read("c.txt") == "from a stream"
    names = {e.name: e.type for e in sandbox.files.list("/home/user")}
    assert names == {"notes": FileType.DIR, "b.bin": FileType.FILE, "c.txt": FileType.FILE}
    assert sandbox.files.exists("notes/a.txt") and not sandbox.files.exists("nothing")
    assert sandbox.files.make_dir("d/e") is True
    assert sandbox.files.make_dir("d/e") is False
    moved = sandbox.files.rename("c.txt", "d/e/c.txt")
    assert moved.path == "/home/user/d/e/c.txt"
    assert sandbox.files.read("d/e/c.txt") == "from a stream"
    assert not sandbox.files.exists("c.txt")
    sandbox.files.remove("d")
    assert not sandbox.files.exists("d/e/c.txt") and not sandbox.files.exists("d")
    with pytest.raises(NotFoundException):
        sandbox.files.read("d/e/c.txt")


def test_a_path_outside_the_home_is_refused_clearly(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="outside /home/user"):
        sandbox.files.write("/etc/passwd-copy", "x")


def test_one_tenants_sandbox_is_invisible_to_another_tenant(server: E2bServer) -> None:
    theirs = Sandbox.create(metadata={"owner": "a"})
    try:
        b = {"api_key": server.keys["team-b"]}
        assert Sandbox.list(**b).next_items() == []
        with pytest.raises(NotFoundException):
            Sandbox.get_info(theirs.sandbox_id, **b)
        with pytest.raises(NotFoundException):
            Sandbox.connect(theirs.sandbox_id, **b)
        assert Sandbox.kill(theirs.sandbox_id, **b) is False
        with pytest.raises(NotFoundException):
            Sandbox.get_info("thereisnosuchsandbox1", **b)
        mine = Sandbox.create(**b)
        try:
            # B's sandbox with A's id: the data plane wants A's access token, which B lacks.
            impostor = Sandbox(
                sandbox_id=theirs.sandbox_id,
                sandbox_domain=None,
                envd_version=mine._envd_version,
                envd_access_token=mine._envd_access_token,
                connection_config=mine.connection_config.__class__(
                    api_key=server.keys["team-b"],
                    extra_sandbox_headers={
                        "E2b-Sandbox-Id": theirs.sandbox_id,
                        "E2b-Sandbox-Port": "49983",
                        "X-Access-Token": mine._envd_access_token,
                    },
                ),
            )
            with pytest.raises(SandboxException, match="was not found"):
                impostor.commands.run("echo nope")
        finally:
            mine.kill()
        assert theirs.commands.run("echo still mine").stdout == "still mine\n"
    finally:
        theirs.kill()


def test_a_paused_sandbox_keeps_its_files_and_processes_and_connect_resumes_it(
    sandbox: Sandbox,
) -> None:
    sandbox.files.write("kept.txt", "before the pause")
    handle = sandbox.commands.run("sleep 300", background=True)
    assert sandbox.pause() is True
    assert sandbox.pause() is False
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    assert sandbox.sandbox_id in [s.sandbox_id for s in paused]
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
    info = resumed.get_info()
    assert info.state == SandboxState.RUNNING
    assert resumed.files.read("kept.txt") == "before the pause"
    assert handle.pid in [p.pid for p in resumed.commands.list()]
    assert resumed.commands.run("echo awake").stdout == "awake\n"


def test_a_sandbox_is_gone_once_its_timeout_runs_out(server: E2bServer) -> None:
    made = Sandbox.create(timeout=3)
    try:
        assert made.is_running()
        wait_until_not_running(made)
        assert not made.is_running()
        with pytest.raises(NotFoundException):
            Sandbox.get_info(made.sandbox_id)
        assert made.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
    finally:
        Sandbox.kill(made.sandbox_id)


def test_a_sandbox_made_to_pause_on_timeout_is_paused_then_resumed_by_connect(
    server: E2bServer,
) -> None:
    made = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        made.files.write("kept.txt", "kept")
        deadline = time.monotonic() + EXPIRY_WAIT
        while (
            Sandbox.get_info(made.sandbox_id).state != SandboxState.PAUSED
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        assert Sandbox.get_info(made.sandbox_id).state == SandboxState.PAUSED
        resumed = Sandbox.connect(made.sandbox_id, timeout=60)
        assert resumed.files.read("kept.txt") == "kept"
        assert resumed.get_info().state == SandboxState.RUNNING
    finally:
        made.kill()


def test_metrics_read_the_containers_usage_now(sandbox: Sandbox) -> None:
    sandbox.commands.run("head -c 20000000 /dev/zero > /dev/null")
    (first,) = sandbox.get_metrics()
    assert first.mem_used > 0 and first.mem_total >= first.mem_used
    assert first.cpu_count >= 1 and first.cpu_used_pct == 0.0  # no earlier sample to rate
    (second,) = sandbox.get_metrics()
    assert second.timestamp >= first.timestamp and second.cpu_used_pct >= 0.0


def test_a_bad_timeout_on_the_control_api_is_a_400_and_changes_nothing(
    server: E2bServer, sandbox: Sandbox
) -> None:
    """What the SDK would never send, sent by hand: every timeout route checks its body."""
    import httpx

    headers = {"X-API-Key": server.keys["team-a"]}
    base = f"{server.url}/sandboxes/{sandbox.sandbox_id}"
    before = sandbox.get_info().end_at
    with httpx.Client(headers=headers, timeout=30) as http:
        for route in ("timeout", "connect", "resume"):
            for body in ({"timeout": "60"}, {"timeout": 0}, {"timeout": True}, {"timeout": 10**9}):
                answer = http.post(f"{base}/{route}", json=body)
                assert answer.status_code == 400, (route, body, answer.text)
                assert "timeout must be" in answer.json()["message"]
        assert http.post(f"{base}/timeout", content=b"not json").status_code == 400
        assert http.post(f"{base}/timeout", json={}).status_code == 400
        # Without a timeout, connect is fine and resume of a running sandbox is a conflict.
        assert http.post(f"{base}/connect", json={}).status_code == 200
        assert http.post(f"{base}/resume", json={}).status_code == 409
    assert sandbox.get_info().end_at == before
