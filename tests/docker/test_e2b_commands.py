"""E2B commands through the session's spawner (``worker/spawner.py``, one long-lived helper in
the sandbox), driven by E2B's own SDK against a real ``sandhold serve --e2b-port``: every
command comes from that one helper (no exec each), output streams while the command runs,
stdin, kills, PTYs; the helper killed or fed forged lines by code in the sandbox costs only the
commands running then, and the next command starts a fresh one; ``git`` is in the base."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import CommandExitException, PtySize, Sandbox

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

pytestmark = pytest.mark.docker

# An upper bound on a wait for output a command prints at once (a loaded machine is slow).
OUTPUT_WAIT = 60.0


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-commands")) as running:
        yield running


@pytest.fixture
def sandbox(server: E2bServer) -> Iterator[Sandbox]:
    made = Sandbox.create()
    try:
        yield made
    finally:
        made.kill()


def spawner_of(sandbox: Sandbox) -> str:
    """The pid of the process that started this command's terminal (the parent of the shell
    that runs E2B's ``bash -l``), and what it runs."""
    ran = sandbox.commands.run(
        'set -- $(cat /proc/$PPID/stat); p=$4; echo "$p $(tr "\\0" " " < /proc/$p/cmdline)"'
    )
    return ran.stdout.strip()


def test_every_command_is_started_by_one_long_lived_spawner(sandbox: Sandbox) -> None:
    first = spawner_of(sandbox)
    assert "/opt/sandhold/worker/spawner.py" in first
    assert [spawner_of(sandbox) for _ in range(3)] == [first] * 3


def test_output_streams_while_the_command_runs(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run(
        "echo first; read reply; echo second:$reply", background=True, stdin=True
    )
    for stdout, _, _ in handle:  # the SDK's stream, read as it comes
        if stdout and "first" in stdout:
            break  # "first" came while the command still waits for its input
    sandbox.commands.send_stdin(handle.pid, "go\n")
    done = handle.wait()
    assert done.exit_code == 0
    assert done.stdout.endswith("second:go\n")


def test_env_cwd_and_exit_codes_and_stderr_come_through_the_spawner(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("sub")
    ran = sandbox.commands.run(
        'echo "$ONE $TWO"; echo oops >&2; pwd', envs={"ONE": "1", "TWO": "two"}, cwd="sub"
    )
    assert ran.stdout.splitlines()[0] == "1 two"
    assert ran.stdout.splitlines()[1].endswith("/sub")
    assert ran.stderr == "oops\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 7")
    assert failed.value.exit_code == 7


def test_a_killed_command_ends_and_leaves_the_list(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 300", background=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as ended:
        handle.wait()
    assert ended.value.exit_code != 0
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def test_a_pty_runs_a_shell_with_its_size_and_input(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=33, cols=101))
    sandbox.pty.send_stdin(terminal.pid, b'echo "size=$(stty size)"\n')
    seen = b""
    for _, _, pty in terminal:
        seen += pty or b""
        if b"size=33 101" in seen:
            break
    sandbox.pty.send_stdin(terminal.pid, b"exit\n")
    assert terminal.wait().exit_code == 0


def test_the_spawner_killed_ends_only_the_commands_running_then(sandbox: Sandbox) -> None:
    first = spawner_of(sandbox).split()[0]
    running = sandbox.commands.run("sleep 300", background=True)
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -9 {first}")
    with pytest.raises(CommandExitException):
        running.wait()  # it ended with its spawner, reported, never hung
    assert sandbox.commands.run("echo after").stdout == "after\n"
    # Nothing it started runs on: no `sleep 300` is left in the sandbox.
    left = sandbox.commands.run(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '^sleep 30[0]'"
        " || true"
    )
    assert left.stdout == "0\n"
    assert spawner_of(sandbox).split()[0] != first


def test_forged_and_malformed_spawner_lines_cost_only_that_moment(sandbox: Sandbox) -> None:
    pid = spawner_of(sandbox).split()[0]
    # A line with a request id nobody waits for and an exit of no process: both dropped.
    forged = '{"id":"0000","ok":true,"pid":5}\\n{"ev":"exit","pid":77777,"code":0}\\n'
    ran = sandbox.commands.run(f"printf '{forged}' > /proc/{pid}/fd/1; echo still")
    assert ran.stdout == "still\n"
    assert spawner_of(sandbox).split()[0] == pid
    # A line that is not JSON: the spawner is out of step and dropped; the next one serves.
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"echo not-json > /proc/{pid}/fd/1; sleep 30")
    assert sandbox.commands.run("echo next").stdout == "next\n"
    assert spawner_of(sandbox).split()[0] != pid


def test_git_is_in_the_base_and_makes_a_repository_in_the_home(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("git --version").stdout.startswith("git version ")
    ran = sandbox.commands.run(
        "git init -q repo && cd repo && git -c user.name=a -c user.email=a@b commit -q "
        "--allow-empty -m one && git log --format=%s",
        cwd="/home/user",
    )
    assert ran.stdout == "one\n"
    assert sandbox.files.exists("/home/user/repo/.git/HEAD")


def test_the_sdks_git_helpers_run_git_in_the_sandbox(sandbox: Sandbox) -> None:
    # A relative path: the helpers pass their path to git as it is, and the home is
    # /workspace here until sandboxes look like E2B's (docs/e2b.md).
    sandbox.git.init("project", initial_branch="main")
    sandbox.files.write("project/a.txt", "one")
    sandbox.git.add("project", all=True)
    sandbox.git.commit("project", "first", author_name="a", author_email="a@example.com")
    status = sandbox.git.status("project")
    assert status.current_branch == "main" and status.file_status == []
