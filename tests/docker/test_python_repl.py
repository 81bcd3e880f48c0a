"""python_repl through the public Python API, against real containers: seed 000's self-test and
the behaviours of issue 3 (validation, timeouts, crashes, concurrency, output)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator.errors import BusyError, InvalidArgumentError, SessionNotFoundError
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def config(image: str, **overrides: object) -> OrchestratorConfig:
    settings: dict[str, object] = {
        "image": image,
        # One id per orchestrator: each reaps the containers of its id that it does not know.
        "orchestrator_id": f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        "extra_labels": {TEST_RUN_LABEL: RUN_ID},
    }
    settings.update(overrides)
    return OrchestratorConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def test_the_seed_self_test_passes(orch: Orchestrator) -> None:
    first = await orch.execute("x = 42\nprint(x)")
    assert first.success and first.created_new_session and first.stdout == "42\n"
    sid = first.session_id

    assert (await orch.execute("print(x * 2)", session_id=sid)).stdout == "84\n"
    assert (await orch.execute("def square(n): return n ** 2", session_id=sid)).success
    assert (await orch.execute("print(square(7))", session_id=sid)).stdout == "49\n"
    pi = await orch.execute("import math\nprint(math.pi)", session_id=sid)
    assert pi.success and pi.stdout.startswith("3.14")
    blocked = await orch.execute("import os", session_id=sid)
    assert not blocked.success and blocked.error_type == "import_blocked"

    names = {v.name for v in (await orch.list_variables(sid)).variables}
    assert {"x", "square"} <= names
    info = await orch.inspect(sid, "x")
    assert info.found and info.type == "int" and info.repr == "42"
    assert len(orch.history(sid)) >= 4
    assert any(s["session_id"] == sid for s in orch.list_sessions())

    await orch.reset(sid)
    after_reset = await orch.execute("print(x)", session_id=sid)
    assert not after_reset.success and after_reset.error_type == "NameError"

    division = await orch.execute("1 / 0", session_id=sid)
    assert division.error_type == "ZeroDivisionError"
    syntax = await orch.execute("this is not valid python syntax", session_id=sid)
    assert syntax.error_type == "SyntaxError"

    for escape in (
        "__import__('os').system('echo pwned')",
        "open('/etc/passwd').read()",
        "eval('1+1')",
        "().__class__.__bases__[0].__subclasses__()",
    ):
        result = await orch.execute(escape, session_id=sid)
        assert not result.success, escape
        assert result.error_type in ("validation", "import_blocked"), escape

    with pytest.raises(SessionNotFoundError):
        await orch.execute("print(1)", session_id="nonexistent_session_id")
    await orch.destroy(sid)
    with pytest.raises(SessionNotFoundError):
        await orch.execute("print(1)", session_id=sid)


async def test_a_final_expression_gives_its_repr_and_metrics_are_reported(
    orch: Orchestrator,
) -> None:
    result = await orch.execute("[i * i for i in range(4)]")
    assert result.result_repr == "[0, 1, 4, 9]"
    assert result.execution_time_ms >= 0
    assert result.cpu_time_ms >= 0
    assert result.peak_memory_mb > 0
    big = await orch.execute("b = bytearray(64 * 1024 * 1024)", session_id=result.session_id)
    assert big.peak_memory_mb >= 60


async def test_bad_arguments_are_refused_before_anything_runs(orch: Orchestrator) -> None:
    for code in ("", "   ", None, 42):
        with pytest.raises(InvalidArgumentError):
            await orch.execute(code)
    for timeout in (0, -1, float("nan"), 10**9, "5", True):
        with pytest.raises(InvalidArgumentError):
            await orch.execute("1", timeout_s=timeout)
    assert orch.list_sessions() == []
    with pytest.raises(InvalidArgumentError):
        await orch.inspect("a" * 32, "not an identifier")


async def test_another_tenants_session_answers_exactly_like_an_unknown_one(
    orch: Orchestrator,
) -> None:
    mine = await orch.execute("secret = 1", tenant="alice")
    with pytest.raises(SessionNotFoundError) as other:
        await orch.execute("print(secret)", session_id=mine.session_id, tenant="bob")
    with pytest.raises(SessionNotFoundError) as unknown:
        await orch.execute("print(secret)", session_id="f" * 32, tenant="bob")
    assert str(other.value).replace(mine.session_id, "ID") == str(unknown.value).replace(
        "f" * 32, "ID"
    )
    assert orch.list_sessions(tenant="bob") == []


async def test_pathological_code_gets_a_validation_error_and_the_session_survives(
    orch: Orchestrator,
) -> None:
    sid = (await orch.execute("alive = True")).session_id
    for code in (
        "(" * 5000 + ")" * 5000,
        "x = " + "[" * 3000 + "]" * 3000,
        "-" * 100_000 + "1",
        "a = 1\0",
        "s = '\ud800'",
        "x = 1\n" * 200_000,
    ):
        result = await orch.execute(code, session_id=sid)
        assert not result.success
        assert result.error_type in ("validation", "SyntaxError"), result
    still = await orch.execute("print(alive)", session_id=sid)
    assert still.stdout == "True\n" and not still.state_reset


async def test_a_timeout_interrupts_and_keeps_state_when_the_code_yields(
    orch: Orchestrator,
) -> None:
    sid = (await orch.execute("kept = 'yes'")).session_id
    result = await orch.execute("while True: pass", session_id=sid, timeout_s=1)
    assert result.timed_out and not result.state_reset and result.error_type == "timeout"
    after = await orch.execute("print(kept)", session_id=sid)
    assert after.stdout == "yes\n" and not after.state_reset


# The inner loop does work: CPython does not deliver an interrupt inside the try of a bare
# ``while True: pass``, which would make this code not swallow anything.
SWALLOWS_INTERRUPTS = (
    "n = 0\n"
    "while True:\n"
    "    try:\n"
    "        while True:\n"
    "            n += 1\n"
    "    except KeyboardInterrupt:\n"
    "        pass"
)


@pytest.mark.parametrize("policy", ["default", "unrestricted-python"])
async def test_code_that_swallows_keyboard_interrupt_ends_within_timeout_and_grace_truthfully(
    orch: Orchestrator, policy: str
) -> None:
    sid = (await orch.execute("kept = 1", policy=policy)).session_id
    with anyio.fail_after(1 + 2 + 10):  # timeout + kill grace + a fresh worker
        result = await orch.execute(SWALLOWS_INTERRUPTS, session_id=sid, timeout_s=1)
    assert result.timed_out
    if policy == "unrestricted-python":
        assert result.state_reset  # nothing stops real Python from swallowing the interrupt
    after = await orch.execute("kept", session_id=sid)
    assert (after.result_repr == "1") is (not result.state_reset)


async def test_a_timeout_ends_a_c_call_that_holds_the_gil(orch: Orchestrator) -> None:
    sid = (await orch.execute("kept = 1")).session_id
    with anyio.fail_after(15):
        # sum() over a range runs in C and never checks for signals.
        result = await orch.execute("sum(range(10**12))", session_id=sid, timeout_s=1)
    assert result.timed_out and result.state_reset
    assert (await orch.execute("1 + 1", session_id=sid)).result_repr == "2"


async def test_a_handler_that_ignores_sigint_still_ends_within_timeout_and_grace(
    orch: Orchestrator,
) -> None:
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    with anyio.fail_after(15):
        result = await orch.execute(code, policy="unrestricted-python", timeout_s=1)
    assert result.timed_out and result.state_reset


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        ("import os\nos._exit(3)", "exited with status 3"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
        ("hog = b'x' * (900 * 1024 * 1024)", "OOM"),
    ],
    ids=["exit", "sigkill", "segfault", "oom"],
)
async def test_a_dead_worker_is_reported_with_its_cause_and_replaced(
    orch: Orchestrator, code: str, cause: str
) -> None:
    sid = (await orch.execute("kept = 1", policy="unrestricted-python")).session_id
    with anyio.fail_after(30):
        crashed = await orch.execute(code, session_id=sid)
    assert crashed.error_type == "process_crashed" and crashed.state_reset
    assert cause in (crashed.error_message or "")
    after = await orch.execute("print('fresh')", session_id=sid)
    assert after.success and after.stdout == "fresh\n" and after.state_reset
    assert (await orch.execute("'again'", session_id=sid)).state_reset is False


async def test_output_from_print_c_code_and_children_lands_in_the_request(
    orch: Orchestrator,
) -> None:
    code = (
        "import os, subprocess, sys\n"
        "print('from print')\n"
        "os.write(1, b'from fd 1\\n')\n"
        "subprocess.run(['echo', 'from a child'])\n"
        "print('to stderr', file=sys.stderr)"
    )
    result = await orch.execute(code, policy="unrestricted-python")
    assert result.stdout == "from print\nfrom fd 1\nfrom a child\n"
    assert result.stderr == "to stderr\n"


async def test_an_output_flood_is_truncated_and_the_session_keeps_working(
    orch: Orchestrator,
) -> None:
    result = await orch.execute("for i in range(200000): print('x' * 100)", timeout_s=60)
    limit = orch.policy("default").output.max_stream_bytes
    assert result.truncated and len(result.stdout.encode()) <= limit
    assert (await orch.execute("6 * 7", session_id=result.session_id)).result_repr == "42"


async def test_two_calls_on_one_session_never_interleave(worker_image: ImageBuildResult) -> None:
    async with Orchestrator(config(worker_image.tag, busy_timeout=0.5)) as orch:
        sid = (await orch.execute("n = 0")).session_id
        outcomes: list[object] = []

        async def slow() -> None:
            outcomes.append(
                await orch.execute("import time\ntime.sleep(2)\nn += 1", session_id=sid)
            )

        async def second() -> None:
            await anyio.sleep(0.3)
            try:
                await orch.execute("n += 100", session_id=sid)
            except BusyError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            tg.start_soon(second)
        assert any(isinstance(o, BusyError) for o in outcomes)
        assert (await orch.execute("n", session_id=sid)).result_repr == "1"


async def test_twenty_sessions_executing_at_once_each_get_their_own_answer(
    orch: Orchestrator,
) -> None:
    results: dict[int, str | None] = {}

    async def one(i: int) -> None:
        first = await orch.execute(f"mine = {i}", tenant=f"t{i}")
        result = await orch.execute("mine * 1000", session_id=first.session_id, tenant=f"t{i}")
        results[i] = result.result_repr

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
    assert results == {i: str(i * 1000) for i in range(20)}


async def test_history_context_keeps_recent_cells_whole_within_the_budget(
    orch: Orchestrator,
) -> None:
    sid = (await orch.execute("a = 1")).session_id
    for i in range(10):
        await orch.execute(f"print('cell {i}')", session_id=sid)
    context = orch.history_context(sid, 2000)
    assert "cell 9" in context and "```python" in context
    assert len(context) <= 2000 * 4
    small = orch.history_context(sid, 30)
    assert len(small) <= 120


async def test_output_without_newlines_binary_and_invalid_utf8_arrives_as_text(
    orch: Orchestrator,
) -> None:
    code = "import os\nos.write(1, b'no newline \\xff\\xfe end')\nos.write(2, bytes(range(1, 32)))"
    result = await orch.execute(code, policy="unrestricted-python")
    assert result.stdout == "no newline \ufffd\ufffd end"
    assert result.stderr == bytes(range(1, 32)).decode()
    assert (result.stdout_bytes, result.stderr_bytes) == (17, 31)
    assert not result.truncated


async def test_a_gigabyte_of_output_costs_bounded_memory_and_reports_its_size(
    orch: Orchestrator,
) -> None:
    code = "import os\nblock = b'x' * (1 << 20)\nfor _ in range(1024):\n    os.write(1, block)"
    with anyio.fail_after(120):
        result = await orch.execute(code, policy="unrestricted-python", timeout_s=100)
    limit = orch.policy("unrestricted-python").output.max_stream_bytes
    assert result.success and result.truncated
    assert len(result.stdout) == limit
    assert result.stdout_bytes == 1 << 30


async def test_at_max_sessions_the_least_recently_active_idle_session_is_evicted(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag, max_sessions=2)) as orch:
        oldest = (await orch.execute("1")).session_id
        newer = (await orch.execute("2")).session_id
        await orch.execute("3", session_id=oldest)  # now `newer` is the least recently active
        third = await orch.execute("4")
        assert {s["session_id"] for s in orch.list_sessions()} == {oldest, third.session_id}
        with pytest.raises(SessionNotFoundError, match="evicted"):
            await orch.execute("1", session_id=newer)


async def test_idle_and_lifetime_limits_end_sessions_and_say_why(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    (tmp_path / "brief.toml").write_text(
        'extends = "default"\n[timeouts]\nidle_s = 1\nmax_lifetime_s = 3\n'
    )
    settings = config(worker_image.tag, policy_dirs=(tmp_path,), reap_interval=0.2)
    async with Orchestrator(settings) as orch:
        idle = (await orch.execute("1", policy="brief")).session_id
        busy = (await orch.execute("1", policy="brief")).session_id
        with anyio.fail_after(20):
            while any(s["session_id"] == idle for s in orch.list_sessions()):
                await orch.execute("1", session_id=busy)  # activity keeps this one alive
                await anyio.sleep(0.2)
        assert any(s["session_id"] == busy for s in orch.list_sessions())
        with pytest.raises(SessionNotFoundError, match="idle"):
            await orch.execute("1", session_id=idle)
        with anyio.fail_after(20), pytest.raises(SessionNotFoundError, match="lifetime"):
            await keep_busy(orch, busy)


async def keep_busy(orch: Orchestrator, session_id: str) -> None:
    """Call the session every 0.2 s until it is gone (so only its lifetime can end it)."""
    while True:
        await orch.execute("1", session_id=session_id)
        await anyio.sleep(0.2)


async def test_destroy_is_idempotent_for_the_owner_and_not_found_for_others(
    orch: Orchestrator,
) -> None:
    sid = (await orch.execute("1")).session_id
    assert await orch.destroy(sid) is True
    assert await orch.destroy(sid) is False
    with pytest.raises(SessionNotFoundError) as caught:
        await orch.destroy(sid, tenant="someone-else")
    assert "ended" not in str(caught.value)
