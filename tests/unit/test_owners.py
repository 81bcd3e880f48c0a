"""Owners: task names are checked, the task scope is ambient for a call (tasks started inside it
included) and restored after it, a task sees only what it owns, and shared terminal actions are
granted per grantee, dropped with their terminals and with a sealed task."""

from __future__ import annotations

import anyio
import pytest
from anyio.lowlevel import checkpoint

from orchestrator._core import owners
from orchestrator._core.owners import Grants, check_task, current_task, may_see, task_scope
from orchestrator.errors import InvalidArgumentError

WAIT_TIMEOUT = 5  # seconds: every wait here is on an event set by a task of the same test

READ = frozenset({"read"})
READ_WRITE = frozenset({"read", "write"})


# -- task names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "7", "agent-1", "A.b_c:d@e-f", "x" * 128, "0" + "-" * 127])
def test_a_valid_task_name_is_returned(name: str) -> None:
    assert check_task(name) == name


def test_no_task_is_none() -> None:
    assert check_task(None) is None


@pytest.mark.parametrize(
    "name",
    ["", "x" * 129, "-agent", ".a", "_a", "a b", "a/b", "a\n", "\na", "é", "a\x00", 7, b"agent"],
    ids=[
        "empty",
        "too-long",
        "leading-dash",
        "leading-dot",
        "leading-underscore",
        "space",
        "slash",
        "trailing-newline",
        "leading-newline",
        "non-ascii",
        "nul",
        "int",
        "bytes",
    ],
)
def test_an_invalid_task_name_is_refused(name: object) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        check_task(name)
    assert caught.value.to_dict()["error_type"] == "invalid_argument"


def test_the_refusal_names_the_argument() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        check_task("bad name", "grantee")
    assert str(caught.value).startswith("grantee ")


# -- the ambient task ---------------------------------------------------------------------------


def test_outside_any_scope_the_caller_is_the_tenant() -> None:
    assert current_task() is None


def test_scopes_nest_and_each_restores_the_one_around_it() -> None:
    with task_scope("outer"):
        assert current_task() == "outer"
        with task_scope(None):
            assert current_task() is None
            with task_scope("inner"):
                assert current_task() == "inner"
            assert current_task() is None
        assert current_task() == "outer"
    assert current_task() is None


def test_a_scope_is_restored_when_its_body_raises() -> None:
    with pytest.raises(KeyError), task_scope("agent"):
        raise KeyError("boom")
    assert current_task() is None


def test_a_scope_with_an_invalid_task_is_refused_and_changes_nothing() -> None:
    with task_scope("outer"):
        with pytest.raises(InvalidArgumentError), task_scope("not valid"):
            pass
        assert current_task() == "outer"


@pytest.mark.anyio
async def test_a_task_started_inside_a_scope_acts_for_that_task() -> None:
    seen: list[str | None] = []
    with anyio.fail_after(WAIT_TIMEOUT):
        async with anyio.create_task_group() as tg:
            with task_scope("agent-1"):
                tg.start_soon(_record, seen)
            with task_scope("agent-2"):
                tg.start_soon(_record, seen)
            tg.start_soon(_record, seen)
    assert sorted(seen, key=lambda task: task or "") == [None, "agent-1", "agent-2"]


async def _record(seen: list[str | None]) -> None:
    await checkpoint()
    seen.append(current_task())


@pytest.mark.anyio
async def test_a_scope_opened_in_a_child_task_does_not_leak_to_its_parent() -> None:
    entered = anyio.Event()
    release = anyio.Event()

    async def child() -> None:
        with task_scope("child"):
            entered.set()
            await release.wait()

    with anyio.fail_after(WAIT_TIMEOUT):
        async with anyio.create_task_group() as tg:
            with task_scope("parent"):
                tg.start_soon(child)
                await entered.wait()
                assert current_task() == "parent"
            assert current_task() is None
            release.set()


# -- who sees what --------------------------------------------------------------------------------


def test_the_tenant_sees_everything_of_its_tenant() -> None:
    assert may_see("agent-1", None)
    assert may_see(None, None)


def test_a_task_sees_only_what_it_owns() -> None:
    assert may_see("agent-1", "agent-1")
    assert not may_see("agent-2", "agent-1")
    assert not may_see(None, "agent-1")


# -- shared terminal actions --------------------------------------------------------------------


def test_a_grant_allows_exactly_its_actions_on_its_terminal_for_its_grantee() -> None:
    grants = Grants()
    grants.grant("team-a", "agent-2", "t1", READ_WRITE)
    assert grants.allows("team-a", "agent-2", "t1", "read")
    assert grants.allows("team-a", "agent-2", "t1", "write")
    assert not grants.allows("team-a", "agent-2", "t1", "kill")
    assert not grants.allows("team-a", "agent-2", "t2", "read")
    assert not grants.allows("team-a", "agent-3", "t1", "read")
    assert not grants.allows("team-b", "agent-2", "t1", "read")


def test_a_later_grant_replaces_the_earlier_one_for_that_terminal() -> None:
    grants = Grants()
    grants.grant("team-a", "agent-2", "t1", READ_WRITE)
    grants.grant("team-a", "agent-2", "t1", READ)
    assert grants.allows("team-a", "agent-2", "t1", "read")
    assert not grants.allows("team-a", "agent-2", "t1", "write")


def test_no_task_holds_no_grant() -> None:
    grants = Grants()
    grants.grant("team-a", "agent-2", "t1", READ)
    assert not grants.allows("team-a", None, "t1", "read")


def test_forgotten_terminals_lose_their_grants_for_every_grantee() -> None:
    grants = Grants()
    grants.grant("team-a", "agent-2", "t1", READ)
    grants.grant("team-a", "agent-3", "t1", READ)
    grants.grant("team-a", "agent-2", "t2", READ)
    grants.forget_terminals({"t1", "t-unknown"})
    assert not grants.allows("team-a", "agent-2", "t1", "read")
    assert not grants.allows("team-a", "agent-3", "t1", "read")
    assert grants.allows("team-a", "agent-2", "t2", "read")


def test_sealing_a_task_drops_its_grants_and_marks_it_sealed() -> None:
    grants = Grants()
    grants.grant("team-a", "agent-2", "t1", READ)
    grants.grant("team-a", "agent-3", "t1", READ)
    assert not grants.sealed("team-a", "agent-2")

    grants.seal("team-a", "agent-2")

    assert grants.sealed("team-a", "agent-2")
    assert not grants.allows("team-a", "agent-2", "t1", "read")
    assert grants.allows("team-a", "agent-3", "t1", "read")
    assert not grants.sealed("team-a", "agent-3")
    assert not grants.sealed("team-b", "agent-2")


def test_the_tenant_itself_is_never_sealed() -> None:
    grants = Grants()
    grants.seal("team-a", "agent-2")
    assert not grants.sealed("team-a", None)


def test_seals_are_bounded_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owners, "MAX_SEALED", 3)
    grants = Grants()
    for task in ("t1", "t2", "t3", "t4"):
        grants.seal("acme", task)
    assert not grants.sealed("acme", "t1")
    assert all(grants.sealed("acme", t) for t in ("t2", "t3", "t4"))
