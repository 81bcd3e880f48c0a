"""The E2B port as a thin adapter: its statuses are the front door's (``E2B_STATUS``, pinned to
the error tree as REST's is), whether a refusal came through a tool call or from the core
directly, and no module of it keeps a status table or a clock of its own; its listing order and
page tokens are pure functions of a sandbox's start and id."""

from __future__ import annotations

import ast
import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.http import E2B_STATUS, status_for
from orchestrator.http.e2b import _control
from orchestrator.http.e2b._errors import status_of
from orchestrator.http.e2b._sandboxes import E2bSandbox, SandboxTable
from orchestrator.http.e2b._tooling import ToolCallError

E2B_PACKAGE = Path(_control.__file__).parent
# Where sandboxes are made, found and ended: a reaper there would be a second lifetime clock.
LIFECYCLE_MODULES = frozenset({"_app.py", "_control.py", "_sandboxes.py", "_surface.py"})


def _tree() -> Iterator[type[OrchestratorError]]:
    pending: list[type[OrchestratorError]] = [OrchestratorError]
    while pending:
        cls = pending.pop()
        yield cls
        pending += cls.__subclasses__()


@pytest.mark.parametrize("cls", sorted(_tree(), key=lambda c: c.__name__))
def test_every_refusal_answers_the_front_doors_e2b_status(cls: type[OrchestratorError]) -> None:
    error = cls.__new__(cls)  # each class's own arguments do not matter here: its code does
    OrchestratorError.__init__(error, "refused")
    wanted = status_for(error, E2B_STATUS)
    assert _control.refusal(error).status_code == wanted
    if error.code in E2B_STATUS and wanted == E2B_STATUS[error.code]:
        assert status_of(ToolCallError(error.code, "refused")) == wanted


def test_no_module_of_the_e2b_port_keeps_a_status_table_or_a_clock() -> None:
    """A dict from error types to statuses, or a sleep loop (a reaper), would be a second copy
    of what the front door and the core own."""
    for path in E2B_PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                assert not any(k in E2B_STATUS for k in keys), (path.name, keys)
            lifecycle = path.name in LIFECYCLE_MODULES
            if lifecycle and isinstance(node, ast.Attribute) and node.attr == "sleep":
                raise AssertionError(f"{path.name}: a sleep (a clock of its own?)")


def _sandbox(sandbox_id: str, second: int, micro: int = 0) -> E2bSandbox:
    started = datetime.datetime(2026, 1, 1, 0, 0, second, micro, tzinfo=datetime.UTC)
    return E2bSandbox(
        sandbox_id=sandbox_id,
        tenant="t",
        session_id="s",
        template="base",
        policy="shell",
        access_token="x",
        envs={},
        started_at=started,
    )


def test_places_sort_as_start_times_do_and_tokens_read_back() -> None:
    # A start on the whole second must not sort after one 0.5 s later (isoformat drops .000000).
    whole, half = _sandbox("b", 1), _sandbox("a", 1, 500_000)
    assert _control._place(whole) < _control._place(half)
    token = _control._token(half)
    assert _control._from_token(token) == _control._place(half)
    with pytest.raises(OrchestratorError):
        _control._from_token("not a token of ours")


def test_order_and_started_after_are_checked() -> None:
    assert _control._descending(None) and _control._descending("desc")
    assert not _control._descending("asc")
    with pytest.raises(OrchestratorError):
        _control._descending("up")
    moment = _control._started_after("2026-01-01T00:00:01Z")
    assert moment == datetime.datetime(2026, 1, 1, 0, 0, 1, tzinfo=datetime.UTC)
    assert _control._started_after("2026-01-01T00:00:01") == moment
    with pytest.raises(OrchestratorError):
        _control._started_after("yesterday")


def test_the_table_writes_through_and_reads_back_after_a_restart(tmp_path: Path) -> None:
    from orchestrator.registry.store import Registry, SessionRecord

    registry = Registry(tmp_path / "registry.db")
    registry.open()
    try:
        registry.add_session(
            SessionRecord(
                id="s",
                tenant="t",
                task=None,
                policy_json="{}",
                container_id="c",
                worker_pid=None,
                created_at="2026-01-01T00:00:00+00:00",
            )
        )
        table = SandboxTable(lambda: registry)
        sandbox = _sandbox(table.new_id(), 1)
        table.add(sandbox)
        fields = {"cmd": "sleep", "args": ["9"], "envs": {}, "cwd": None, "tag": None}
        first = sandbox.add_command(terminal_id="t1", pty=False, **fields)
        second = sandbox.add_command(terminal_id="t2", pty=True, **fields)
        assert (first.pid, second.pid) == (1000, 1001)
        sandbox.commands.pop(first.pid)
        kept = registry.e2b(sandbox.sandbox_id)
        assert kept is not None and [c.pid for c in kept.commands] == [second.pid]
        assert table.with_token(sandbox.sandbox_id, "x") is sandbox
        assert table.with_token(sandbox.sandbox_id, "y") is None
        assert table.of_tenant(sandbox.sandbox_id, "other") is None

        after_restart = SandboxTable(lambda: registry)
        found = after_restart.of_tenant(sandbox.sandbox_id, "t")
        assert found is not None and found.session_id == "s"
        assert found.commands == {} and found.next_pid == 1002  # terminals died; pids go on
        assert found.add_command(terminal_id="t3", pty=False, **fields).pid == 1002

        registry.remove_session("s")  # the session ended: its sandbox is gone with it
        assert after_restart.of_tenant(sandbox.sandbox_id, "t") is None
        assert after_restart.listed("t") == []
    finally:
        registry.close()
