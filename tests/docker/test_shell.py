"""The persistent shell in a real session container."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import InvalidArgumentError, SessionNotFoundError
from orchestrator.policy.model import Policy, load_policy
from orchestrator.session.shell import PersistentShell
from tests.conftest import ContainerFactory

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

OpenShell = Callable[[Policy], Awaitable[PersistentShell]]


def tuned(*, grace: float = 1.0) -> Policy:
    policy = load_policy("default")
    timeouts = policy.timeouts.model_copy(update={"kill_grace_s": grace})
    return policy.model_copy(update={"timeouts": timeouts})


@pytest.fixture
async def open_shell(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> AsyncIterator[OpenShell]:
    opened: list[PersistentShell] = []

    async def open_(policy: Policy) -> PersistentShell:
        shell = PersistentShell(docker_backend, await make_container(policy), policy)
        opened.append(shell)
        return shell

    try:
        yield open_
    finally:
        for shell in opened:
            await shell.aclose()


@pytest.fixture
async def shell(open_shell: OpenShell) -> PersistentShell:
    return await open_shell(tuned())


async def test_a_command_returns_its_output_exit_code_and_cwd(shell: PersistentShell) -> None:
    with anyio.fail_after(30):
        result = await shell.run("echo hello; echo oops >&2; false")
    assert result.stdout == "hello\noops\n"
    assert (result.exit_code, result.cwd) == (1, "/workspace")
    assert not (result.timed_out or result.shell_restarted or result.truncated)


async def test_the_shell_keeps_cd_export_and_functions_between_calls(
    shell: PersistentShell,
) -> None:
    with anyio.fail_after(30):
        await shell.run("mkdir -p deep/er && cd deep/er")
        await shell.run('export GREETING=hej; declare -a LIST=(a b); greet() { echo "$1 $2"; }')
        result = await shell.run('greet "$GREETING" "${LIST[1]}"; pwd; bash -c \'echo $GREETING\'')
    assert result.stdout == "hej b\n/workspace/deep/er\nhej\n"
    assert result.cwd == "/workspace/deep/er"


async def test_a_multi_line_command_with_quotes_and_a_heredoc_runs_as_written(
    shell: PersistentShell,
) -> None:
    command = "x='it'\"'\"'s $HOME'\ncat <<'EOF'\n$x \\n 'q' \"dq\" `tick` €\nEOF\necho \"$x\""
    with anyio.fail_after(30):
        result = await shell.run(command)
    assert result.stdout == "$x \\n 'q' \"dq\" `tick` €\nit's $HOME\n"


async def test_output_that_looks_like_framing_is_just_output(shell: PersistentShell) -> None:
    fake = "printf '\\n%s:%s:%s:%s\\n' abc 0 / abc; printf 'tail'"
    with anyio.fail_after(30):
        result = await shell.run(fake)
        after = await shell.run("echo next")
    assert result.stdout == "\nabc:0:/:abc\ntail"
    assert result.exit_code == 0
    assert after.stdout == "next\n"


async def test_a_command_reading_stdin_does_not_eat_the_shells_input(
    shell: PersistentShell,
) -> None:
    with anyio.fail_after(30):
        result = await shell.run('read -r line; echo "got:$line"; cat; echo done')
        after = await shell.run("echo still")
    assert result.stdout == "got:\ndone\n"
    assert after.stdout == "still\n"


@pytest.mark.parametrize("command", ["sleep 100", "while :; do :; done", "sleep 100; echo after"])
async def test_a_never_ending_command_is_interrupted_at_its_timeout_and_the_shell_stays(
    shell: PersistentShell, command: str
) -> None:
    await shell.run("cd /tmp; export KEPT=yes")
    with anyio.fail_after(30):
        result = await shell.run(command, timeout_s=1)
        after = await shell.run('echo "$KEPT $PWD"')
    assert result.timed_out
    assert not result.shell_restarted
    assert result.exit_code == 130
    assert "after" not in result.stdout
    assert after.stdout == "yes /tmp\n"
    assert not after.timed_out


async def test_a_command_that_ignores_the_interrupt_gets_the_shell_replaced_and_says_so(
    shell: PersistentShell,
) -> None:
    await shell.run("cd /tmp")
    with anyio.fail_after(30):
        result = await shell.run("trap '' INT; echo started; sleep 100", timeout_s=1)
        after = await shell.run("pwd")
    assert (result.timed_out, result.shell_restarted) == (True, True)
    assert result.stdout == "started\n"
    assert result.cwd == "/workspace"
    assert (after.stdout, after.shell_restarted) == ("/workspace\n", False)


async def test_a_shell_that_exits_is_replaced_and_the_result_says_so(
    shell: PersistentShell,
) -> None:
    await shell.run("export GONE=soon")
    with anyio.fail_after(30):
        result = await shell.run("echo bye; exit 7")
        after = await shell.run('echo "[$GONE]"')
    # An interactive bash says "exit" as it goes, as at a keyboard.
    assert result.stdout in ("bye\n", "bye\nexit\n")
    assert (result.exit_code, result.shell_restarted) == (7, True)
    assert after.stdout == "[]\n"


async def test_output_beyond_the_stream_cap_is_cut_and_flagged(shell: PersistentShell) -> None:
    cap = tuned().output.max_stream_bytes
    with anyio.fail_after(60):
        result = await shell.run(f"head -c {4 * cap} /dev/zero | tr '\\0' x; echo; echo end")
    assert result.truncated
    assert result.stdout == "x" * cap
    assert result.exit_code == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": ""},
        {"command": " \n "},
        {"command": "cd /\0"},
        {"command": 5},
        {"command": "cd / \ud800"},
        {"timeout_s": -1},
        {"timeout_s": 0},
        {"timeout_s": True},
        {"timeout_s": "5"},
        {"timeout_s": 10**9},
        {"timeout_s": float("nan")},
    ],
)
async def test_bad_arguments_are_refused_and_change_nothing(
    shell: PersistentShell, kwargs: dict[str, Any]
) -> None:
    await shell.run("cd /tmp")
    arguments = {"command": "cd /", **kwargs}
    with pytest.raises(InvalidArgumentError):
        await shell.run(**arguments)
    assert (await shell.run("pwd")).stdout == "/tmp\n"


async def test_a_closed_shell_kills_what_it_ran_and_refuses_more(
    docker_backend: DockerBackend, shell: PersistentShell
) -> None:
    async def running() -> bytes:
        argv = ["bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]
        listing = await docker_backend.run(
            shell._container_id, ExecSpec(argv=argv), timeout=30, max_output_bytes=1 << 20
        )
        return listing.stdout

    await shell.run("sleep 121 &")
    assert b"sleep 121" in await running()
    with anyio.fail_after(30):
        await shell.aclose()
    with pytest.raises(SessionNotFoundError):
        await shell.run("true")
    assert b"sleep 121" not in await running()
