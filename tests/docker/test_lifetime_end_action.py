"""A session's lifetime end action, against real containers: with ``end_action="pause"`` the end
``set_timeout`` gave a session pauses it (E2B's auto-pause) instead of ending it; the paused
session waits for its resume whatever its idle timeout says, and a call thaws it with its state
and a fresh lifetime. And the REPL's own policy checks: ``Repl.execute`` called directly refuses
a timeout past ``max_command_s`` and a forbidden env, as the tool does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.images import ImageBuildResult
from orchestrator.session.session import Session
from tests.docker.test_lifecycle import wait_until_ended
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# A few short lifetimes and reaper rounds (0.2 s apart) on one or two sessions.
SCENARIO_TIMEOUT = 60.0
# Idle after 1 s and then destroyed: a paused session that waits for its resume must outlive it.
IDLE_POLICY = (
    'name = "brief"\nextends = "default"\n'
    '[timeouts]\nidle_s = 1\nidle_action = "destroy"\nmax_lifetime_s = 600\n'
)


@pytest.fixture
async def orch(worker_image: ImageBuildResult, tmp_path: Path) -> AsyncIterator[Orchestrator]:
    (tmp_path / "brief.toml").write_text(IDLE_POLICY)
    settings = config(worker_image.tag, policy_dirs=(tmp_path,), reap_interval=0.2)
    async with Orchestrator(settings) as orchestrator:
        yield orchestrator


async def wait_until_paused(session: Session) -> None:
    """Watched on the session object: looking it up through the orchestrator counts as activity."""
    while not session.paused:  # noqa: ASYNC110 (the reaper sends no event)
        await anyio.sleep(0.1)


async def test_the_end_of_a_lifetime_with_end_action_pause_pauses_the_session(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        session = await orch.create_session()
        assert (await orch.execute("x = 41", session_id=session.id)).success
        await orch.set_timeout(session.id, 1, end_action="pause")
        assert session.lifetime_end_action == "pause" and session.lifetime_s == 1.0

        await wait_until_paused(session)
        assert session.ends_at is None  # its clock is stopped while it waits for its resume
        assert not session.closed
        state = await orch.backend.container_state(session.container_id)
        assert state.status == "paused"

        # A call thaws it, its state kept, with a fresh lifetime of the same length.
        thawed = await orch.execute("x + 1", session_id=session.id)
        assert thawed.success and thawed.result_repr == "42", thawed
        assert not session.paused and session.ends_at is not None
        await wait_until_paused(session)  # and that lifetime's end pauses it again
        assert await orch.resume(session.id) is True
        assert (await orch.execute("x", session_id=session.id)).result_repr == "41"


async def test_a_session_waiting_for_its_resume_is_not_ended_for_idleness(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        waiting = await orch.create_session(policy="brief")
        # Its end comes before its idle timeout (and wins if a late round finds both due).
        await orch.set_timeout(waiting.id, 0.3, end_action="pause")
        plain = await orch.create_session(policy="brief")
        await wait_until_paused(waiting)
        assert "idle" in await wait_until_ended(orch, plain.id)  # idle_s passed for both
        assert not waiting.closed and waiting.paused
        assert (await orch.execute("1 + 1", session_id=waiting.id)).result_repr == "2"


async def test_the_default_end_action_still_ends_the_session(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        session = await orch.create_session()
        await orch.set_timeout(session.id, 30, end_action="pause")
        await orch.set_timeout(session.id, 1, end_action="end")
        assert "set_timeout" in await wait_until_ended(orch, session.id)
        assert not session.paused


async def test_an_unknown_end_action_is_refused(orch: Orchestrator) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        session = await orch.create_session()
        for wrong in ("kill", "", 1, ["pause"]):
            with pytest.raises(InvalidArgumentError):
                await orch.set_timeout(session.id, 30, end_action=wrong)
        assert session.lifetime_end_action == "end" and session.ends_at is None


async def test_repl_execute_called_directly_applies_the_policys_cell_rules(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        session = await orch.session((await orch.create_session()).id)
        limit = session.policy.timeouts.max_command_s
        with pytest.raises(InvalidArgumentError) as too_long:
            await session.repl.execute("1", timeout=limit + 1)
        assert too_long.value.error_type == "invalid_argument"
        with pytest.raises(PolicyViolationError) as denied:
            await session.repl.execute("1", env={"PYTHONPATH": "/tmp"})
        assert (denied.value.error_type, denied.value.rule) == ("policy", "env.deny")
        with pytest.raises(PolicyViolationError) as reserved:
            await session.repl.execute("1", env={"LD_PRELOAD": "/tmp/x.so"})
        assert reserved.value.rule == "env.reserved"
        with pytest.raises(InvalidArgumentError):
            await session.repl.execute("   ")
        # Within the rules, the policy's default timeout applies, and the cell runs.
        assert (await session.repl.execute("6 * 7")).result_repr == "42"
