"""A cell's outcome in the history (issue 32.2): ``ok``, ``error`` or ``cancelled``, as the
``history`` operation lists it, and the same after the registry is closed and opened again (a
restart of the orchestrator re-adopts the session with its history)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from orchestrator.registry.store import Registry
from orchestrator.session.history import CodeHistory, HistoryEntry
from tests.unit.test_store import T0, record


def test_each_outcome_is_listed_and_survives_a_reopened_registry(tmp_path: Path) -> None:
    history = CodeHistory(max_entries=10)
    kept = [
        history.record("x = 1", success=True, output=""),
        history.record("1 / 0", success=False, output="ZeroDivisionError: division by zero"),
        history.record("x = 2; sleep()", success=False, output="stopped", cancelled=True),
    ]
    assert [e.to_dict()["outcome"] for e in history.entries] == ["ok", "error", "cancelled"]

    path = tmp_path / "registry.db"
    first = Registry(path)
    first.open()
    first.add_session(record("s1"))
    for entry in kept:
        first.add_history("s1", entry, keep=10)
    first.close()
    again = Registry(path)
    again.open()
    try:
        read = again.history("s1", keep=10)
    finally:
        again.close()
    assert [e.outcome for e in read] == ["ok", "error", "cancelled"]
    assert [e.success for e in read] == [True, False, False]


def test_a_row_written_before_outcomes_reads_as_it_did() -> None:
    old = HistoryEntry(1, "x", T0 + timedelta(seconds=1), False, "")
    assert old.outcome == "error" and old.summary == "error"
