"""Terminals in a real session container: start/read/wait/write/interrupt/kill/resize."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import psutil
import pytest

from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import InvalidArgumentError, QuotaExceededError, SessionNotFoundError
from orchestrator.policy.model import Policy, load_policy
from orchestrator.session.terminal.terminals import SessionTerminals, TerminalResult
from tests.conftest import ContainerFactory

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1024 * 1024
Open = Callable[..., Awaitable[SessionTerminals]]


def tuned(*, grace: float = 0.5, terminals: int | None = None) -> Policy:
    policy = load_policy("default")
    limits = policy.limits
    if terminals is not None:
        limits = limits.model_copy(update={"terminals_per_session": terminals})
    timeouts = policy.timeouts.model_copy(update={"kill_grace_s": grace})
    return policy.model_copy(update={"timeouts": timeouts, "limits": limits})


@pytest.fixture
async def open_terminals(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> AsyncIterator[Open]:
    """Open the terminals of a fresh session; all are closed when the test ends."""
    opened: list[SessionTerminals] = []

    async def open_(policy: Policy | None = None, **kwargs: Any) -> SessionTerminals:
        policy = policy or tuned()
        container_id = await make_container(policy)
        terminals = SessionTerminals(docker_backend, container_id, policy, **kwargs)
        await terminals.__aenter__()
        opened.append(terminals)
        return terminals

    try:
        yield open_
    finally:
        for terminals in reversed(opened):
            await terminals.__aexit__(None, None, None)


@pytest.fixture
async def terms(open_terminals: Open) -> SessionTerminals:
    return await open_terminals()


async def drain(terms: SessionTerminals, result: TerminalResult) -> tuple[str, TerminalResult]:
    """All output from ``result`` on, until the terminal has exited."""
    text = result.output
    with anyio.fail_after(30):
        while result.state == "running" or result.has_more:
            result = await terms.wait(
                result.terminal_id, since_seq=result.next_seq, timeout_ms=10_000
            )
            text += result.output
    return text, result


async def wait_for_text(terms: SessionTerminals, terminal_id: str, text: str) -> TerminalResult:
    """Wait until the terminal's whole output contains ``text``."""
    with anyio.fail_after(30):
        while True:
            result = await terms.read(terminal_id)
            if text in result.output or result.state == "exited":
                return result
            await terms.wait(terminal_id, since_seq=result.next_seq, timeout_ms=10_000)


async def processes(backend: DockerBackend, terms: SessionTerminals) -> str:
    """Every command line running in the session's container."""
    argv = ["bash", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"]
    result = await backend.run(
        terms._container_id, ExecSpec(argv=argv), timeout=30, max_output_bytes=MIB
    )
    return result.stdout.decode()


# -- start ---------------------------------------------------------------------------------------


async def test_start_returns_at_the_first_output_without_waiting_for_the_end(
    terms: SessionTerminals,
) -> None:
    with anyio.fail_after(15):
        result = await terms.start("echo first; sleep 60", yield_time_ms=20_000)
    assert "first" in result.output
    assert (result.state, result.wait_reason, result.exit_code) == ("running", "output", None)
    assert len(result.terminal_id) >= 32


async def test_start_returns_when_the_command_ends(terms: SessionTerminals) -> None:
    with anyio.fail_after(15):
        result = await terms.start("exit 3", yield_time_ms=20_000)
    assert (result.state, result.exit_code, result.wait_reason) == ("exited", 3, "exited")


async def test_start_returns_when_the_yield_time_runs_out(terms: SessionTerminals) -> None:
    with anyio.fail_after(15):
        result = await terms.start("sleep 60", yield_time_ms=300)
    assert (result.state, result.wait_reason, result.output) == ("running", "timeout", "")


async def test_a_terminal_runs_as_the_sandbox_user_in_the_given_cwd_with_the_given_env(
    terms: SessionTerminals,
) -> None:
    await drain(terms, await terms.start("mkdir -p sub/dir", use_pty=False))
    result = await terms.start(
        'echo "$(id -u) $PWD $GREETING"', use_pty=False, cwd="sub/dir", env={"GREETING": "hej"}
    )
    text, _ = await drain(terms, result)
    assert text == "10001 /workspace/sub/dir hej\n"


async def test_a_cwd_that_does_not_exist_is_an_invalid_argument(terms: SessionTerminals) -> None:
    with pytest.raises(InvalidArgumentError):
        await terms.start("pwd", cwd="no/such/dir")


# -- reading -------------------------------------------------------------------------------------


async def test_read_with_since_seq_and_since_offset_returns_exactly_the_new_output(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("cat", use_pty=False, yield_time_ms=0)
    await terms.write(started.terminal_id, "one\n")
    first = await terms.wait(started.terminal_id, since_seq=0, timeout_ms=10_000)
    assert first.output == "one\n"
    await terms.write(started.terminal_id, "two\n")
    second = await terms.wait(started.terminal_id, since_seq=first.next_seq, timeout_ms=10_000)
    assert (second.output, second.next_offset) == ("two\n", 8)
    by_offset = await terms.read(started.terminal_id, since_offset=first.next_offset)
    assert (by_offset.output, by_offset.next_offset) == ("two\n", 8)
    nothing = await terms.read(started.terminal_id, since_seq=second.next_seq)
    assert (nothing.output, nothing.gap) == ("", False)
    everything = await terms.read(started.terminal_id)
    assert everything.output == "one\ntwo\n"


async def test_wait_with_nothing_new_returns_at_its_timeout(terms: SessionTerminals) -> None:
    started = await terms.start("cat", use_pty=False, yield_time_ms=0)
    with anyio.fail_after(10):
        result = await terms.wait(started.terminal_id, since_offset=0, timeout_ms=200)
    assert (result.wait_reason, result.output, result.state) == ("timeout", "", "running")


async def test_a_read_past_the_end_of_the_output_is_an_invalid_argument(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("echo hi", use_pty=False, yield_time_ms=10_000)
    _, done = await drain(terms, started)
    with pytest.raises(InvalidArgumentError):
        await terms.read(done.terminal_id, since_offset=done.next_offset + 1)
    with pytest.raises(InvalidArgumentError):
        await terms.wait(done.terminal_id, since_seq=done.next_seq + 1)


async def test_a_gap_is_reported_when_output_was_dropped(terms: SessionTerminals) -> None:
    cap = terms._policy.output.max_stream_bytes
    total = 3 * cap
    started = await terms.start(f"head -c {total} /dev/zero | tr '\\0' x", use_pty=False)
    _, done = await drain(terms, started)
    by_offset = await terms.read(done.terminal_id, since_offset=0, max_bytes=4 * MIB)
    assert by_offset.gap
    assert by_offset.dropped_bytes is not None
    assert by_offset.dropped_bytes + len(by_offset.output) == total
    by_seq = await terms.read(done.terminal_id, since_seq=0, max_bytes=4 * MIB)
    assert by_seq.gap
    assert by_seq.dropped_chunks
    assert by_seq.output == by_offset.output


async def test_an_output_flood_keeps_memory_bounded(terms: SessionTerminals) -> None:
    cap = terms._policy.output.max_stream_bytes
    total = 64 * MIB
    rss_before = psutil.Process().memory_info().rss
    started = await terms.start(f"head -c {total} /dev/zero", use_pty=False, yield_time_ms=0)
    with anyio.fail_after(120):
        done = await terms.wait(started.terminal_id, since_offset=0, timeout_ms=60_000)
        while done.state == "running":
            done = await terms.wait(
                started.terminal_id, since_offset=done.next_offset, timeout_ms=60_000
            )
    rss_growth = psutil.Process().memory_info().rss - rss_before
    everything = await terms.read(started.terminal_id, since_offset=0, max_bytes=4 * MIB)
    assert everything.next_offset == total
    assert len(everything.output) <= cap
    assert everything.gap
    assert rss_growth < 32 * MIB


async def test_max_output_chars_shortens_the_text_and_says_so(terms: SessionTerminals) -> None:
    started = await terms.start("seq 1 2000", use_pty=False)
    _, done = await drain(terms, started)
    short = await terms.read(done.terminal_id, max_output_chars=200)
    assert len(short.output) <= 200
    assert short.truncated
    assert short.omitted_chars > 0
    assert short.output.startswith("1\n2\n")
    assert short.output.endswith("2000\n")


# -- input ---------------------------------------------------------------------------------------


async def test_a_pty_program_asking_for_input_is_answered_through_write(
    terms: SessionTerminals,
) -> None:
    started = await terms.start('read -p "name? " n; echo "hi $n"', yield_time_ms=10_000)
    prompt = await wait_for_text(terms, started.terminal_id, "name? ")
    assert "name? " in prompt.output
    written = await terms.write(started.terminal_id, "bob\n")
    assert written.written_bytes == 4
    text, done = await drain(terms, prompt)
    assert "hi bob" in text
    assert (done.state, done.exit_code) == ("exited", 0)


async def test_write_with_close_stdin_on_a_pipes_terminal_ends_cat(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("cat", use_pty=False, yield_time_ms=0)
    status = await terms.write(started.terminal_id, "data\n", close_stdin=True)
    assert status.stdin_closed
    text, done = await drain(terms, started)
    assert text == "data\n"
    assert (done.state, done.exit_code) == ("exited", 0)
    with pytest.raises(InvalidArgumentError):
        await terms.write(started.terminal_id, "more")


async def test_close_stdin_is_refused_on_a_pty_and_changes_nothing(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("cat", yield_time_ms=0)
    with pytest.raises(InvalidArgumentError) as caught:
        await terms.write(started.terminal_id, "x", close_stdin=True)
    assert caught.value.code == "invalid_argument"
    await terms.write(started.terminal_id, "still here\n")
    echoed = await wait_for_text(terms, started.terminal_id, "still here")
    assert echoed.state == "running"
    assert "x" not in echoed.output.replace("here", "")


# -- signals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_pty", [True, False], ids=["pty", "pipes"])
async def test_interrupt_stops_a_sleep(terms: SessionTerminals, use_pty: bool) -> None:
    started = await terms.start("sleep 100", use_pty=use_pty, yield_time_ms=0)
    status = await terms.interrupt(started.terminal_id)
    assert status.signal_sent
    _, done = await drain(terms, started)
    assert (done.state, done.exit_code) == ("exited", 130)


async def test_interrupt_reaches_every_process_of_the_command(
    docker_backend: DockerBackend, terms: SessionTerminals
) -> None:
    started = await terms.start("sleep 101 | sleep 102; sleep 103", use_pty=False)
    await terms.interrupt(started.terminal_id)
    await drain(terms, started)
    seen = await processes(docker_backend, terms)
    assert not any(f"sleep {n}" in seen for n in (101, 102, 103))


async def test_kill_with_a_misspelt_signal_is_an_invalid_argument_and_changes_nothing(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("sleep 100", yield_time_ms=0)
    for bad in ("TREM", "SIGFOO", "", 0, 999, True, None, 1.5):
        with pytest.raises(InvalidArgumentError):
            await terms.kill(started.terminal_id, signal=bad)  # type: ignore[arg-type]
    still = await terms.wait(started.terminal_id, timeout_ms=300)
    assert still.state == "running"


@pytest.mark.parametrize("name", ["TERM", "SIGTERM", "term", 15, "15"])
async def test_kill_accepts_a_signal_by_name_or_number(
    terms: SessionTerminals, name: str | int
) -> None:
    started = await terms.start("sleep 100", yield_time_ms=0)
    status = await terms.kill(started.terminal_id, signal=name)
    assert (status.signal, status.signal_sent, status.escalated) == ("TERM", True, False)
    assert (status.state, status.exit_code) == ("exited", 143)


async def test_kill_of_a_program_ignoring_term_falls_back_to_kill(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("trap '' TERM; echo ready; sleep 100", use_pty=False)
    await wait_for_text(terms, started.terminal_id, "ready")
    with anyio.fail_after(20):
        status = await terms.kill(started.terminal_id)
    assert (status.signal_sent, status.escalated) == (True, True)
    assert (status.state, status.exit_code) == ("exited", 137)


async def test_signals_to_an_exited_terminal_are_not_sent(terms: SessionTerminals) -> None:
    _, done = await drain(terms, await terms.start("true"))
    assert not (await terms.interrupt(done.terminal_id)).signal_sent
    assert not (await terms.kill(done.terminal_id)).signal_sent


# -- resize, retention, limits -------------------------------------------------------------------


async def test_resize_changes_what_stty_size_reports(terms: SessionTerminals) -> None:
    started = await terms.start("read -r _; stty size", yield_time_ms=0)
    await terms.resize(started.terminal_id, 40, 132)
    await terms.write(started.terminal_id, "\n")
    text, _ = await drain(terms, started)
    assert "40 132" in text


async def test_a_pty_starts_at_24_by_80(terms: SessionTerminals) -> None:
    text, _ = await drain(terms, await terms.start("stty size"))
    assert text.strip() == "24 80"


async def test_resize_of_a_pipes_terminal_is_an_invalid_argument(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("sleep 100", use_pty=False, yield_time_ms=0)
    with pytest.raises(InvalidArgumentError):
        await terms.resize(started.terminal_id, 40, 100)


async def test_finished_terminals_are_forgotten_after_the_retention_period(
    open_terminals: Open,
) -> None:
    now = [1000.0]
    terms = await open_terminals(retention_s=60.0, clock=lambda: now[0])
    _, done = await drain(terms, await terms.start("echo bye"))
    now[0] += 59
    assert (await terms.read(done.terminal_id)).output.strip() == "bye"
    now[0] += 2
    with pytest.raises(SessionNotFoundError) as caught:
        await terms.read(done.terminal_id)
    assert caught.value.code == "session_not_found"


async def test_running_more_terminals_than_the_policy_allows_is_quota_exceeded(
    open_terminals: Open,
) -> None:
    terms = await open_terminals(tuned(terminals=2))
    first = await terms.start("sleep 100", yield_time_ms=0)
    await terms.start("sleep 100", yield_time_ms=0)
    with pytest.raises(QuotaExceededError) as caught:
        await terms.start("sleep 100", yield_time_ms=0)
    assert caught.value.code == "quota_exceeded"
    assert "terminals_per_session" in str(caught.value)
    await terms.kill(first.terminal_id, signal="KILL")
    third = await terms.start("echo again", yield_time_ms=10_000)
    assert "again" in (await drain(terms, third))[0]


async def test_an_unknown_terminal_id_is_session_not_found(terms: SessionTerminals) -> None:
    for call in (
        terms.read("term_" + "0" * 32),
        terms.wait("nope", timeout_ms=0),
        terms.write("nope", "x"),
        terms.interrupt("nope"),
        terms.kill("nope"),
        terms.resize("nope", 10, 10),
    ):
        with pytest.raises(SessionNotFoundError):
            await call


async def test_closing_kills_every_running_command(
    docker_backend: DockerBackend, open_terminals: Open
) -> None:
    terms = await open_terminals()
    await terms.start("sleep 111", yield_time_ms=0)
    await terms.start("sleep 112", use_pty=False, yield_time_ms=0)
    with anyio.fail_after(30):
        await terms.aclose()
    seen = await processes(docker_backend, terms)
    assert "sleep 111" not in seen
    assert "sleep 112" not in seen
    with pytest.raises(SessionNotFoundError):
        await terms.start("true")


# -- bad arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": ""},
        {"command": "   "},
        {"command": "sleep 77\0"},
        {"command": 77},
        {"command": "sleep 77 \ud800"},
        {"use_pty": "yes"},
        {"yield_time_ms": -1},
        {"yield_time_ms": 10**9},
        {"yield_time_ms": 1.5},
        {"yield_time_ms": True},
        {"yield_time_ms": "100"},
        {"max_bytes": 0},
        {"max_bytes": 10**12},
        {"max_bytes": False},
        {"max_output_chars": -5},
        {"cwd": "/etc"},
        {"cwd": "../../etc"},
        {"env": {"A": "a\0b"}},
        {"env": {"BAD NAME": "x"}},
        {"env": ["A=b"]},
    ],
)
async def test_bad_start_arguments_are_refused_and_nothing_starts(
    docker_backend: DockerBackend, terms: SessionTerminals, kwargs: dict[str, Any]
) -> None:
    arguments = {"command": "sleep 77", **kwargs}
    with pytest.raises(InvalidArgumentError):
        await terms.start(**arguments)
    assert "sleep 77" not in await processes(docker_backend, terms)
    assert terms._terminals == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"since_seq": -1},
        {"since_seq": True},
        {"since_seq": "0"},
        {"since_offset": 1.0},
        {"since_seq": 0, "since_offset": 0},
        {"max_bytes": 10},
        {"max_output_chars": 0},
    ],
)
async def test_bad_read_and_wait_arguments_are_invalid(
    terms: SessionTerminals, kwargs: dict[str, Any]
) -> None:
    started = await terms.start("sleep 100", yield_time_ms=0)
    with pytest.raises(InvalidArgumentError):
        await terms.read(started.terminal_id, **kwargs)
    with pytest.raises(InvalidArgumentError):
        await terms.wait(started.terminal_id, timeout_ms=0, **kwargs)


async def test_bad_ids_inputs_and_sizes_are_invalid_and_change_nothing(
    terms: SessionTerminals,
) -> None:
    started = await terms.start("cat", use_pty=False, yield_time_ms=0)
    tid = started.terminal_id
    calls: list[Awaitable[object]] = [
        terms.read(5),  # type: ignore[arg-type]
        terms.read("x" * 500),
        terms.wait(tid, timeout_ms=-1),
        terms.wait(tid, timeout_ms=10**9),
        terms.wait(tid, timeout_ms=None),  # type: ignore[arg-type]
        terms.write(tid, 5),  # type: ignore[arg-type]
        terms.write(tid, "x", close_stdin="yes"),  # type: ignore[arg-type]
        terms.write(tid, "\ud800"),
        terms.resize(tid, 0, 80),
        terms.resize(tid, 24, True),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            await call
    await terms.write(tid, "fine\n", close_stdin=True)
    text, _ = await drain(terms, started)
    assert text == "fine\n"
