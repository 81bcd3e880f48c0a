"""The SQLite registry: one orchestrator at a time per file (a flock that dies with its holder),
its id made once and kept, sessions with their items and code history, and files it cannot use
refused as ``RegistryError``."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.errors import InvalidArgumentError, RegistryError
from orchestrator.registry.store import (
    PRUNE_EVERY,
    SCHEMA_VERSION,
    Registry,
    SessionRecord,
)
from orchestrator.session.history import HistoryEntry

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
CHILD_TIMEOUT = 60  # seconds: a fresh interpreter importing the package, generous for slow CI

# Opens the registry, says so, then waits for its stdin to close and exits without closing it.
CHILD = """
import os, sys
from pathlib import Path
from orchestrator.registry.store import Registry
Registry(Path(sys.argv[1])).open()
print("open", flush=True)
sys.stdin.read()
os._exit(0)
"""


def record(session_id: str, *, container: str | None = None, minute: int = 0) -> SessionRecord:
    return SessionRecord(
        id=session_id,
        tenant="team-a",
        task=None,
        policy_json='{"name": "default"}',
        container_id=container or f"c-{session_id}",
        worker_pid=None,
        created_at=(T0 + timedelta(minutes=minute)).isoformat(),
    )


def entry(index: int, code: str = "x = 1", output: str = "") -> HistoryEntry:
    return HistoryEntry(index, code, T0 + timedelta(seconds=index), True, output)


def set_user_version(path: Path, version: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    try:
        db.execute(f"PRAGMA user_version={version}")
    finally:
        db.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "registry.db"


@pytest.fixture
def registry(path: Path) -> Iterator[Registry]:
    reg = Registry(path)
    reg.open()
    try:
        yield reg
    finally:
        reg.close()


# -- opening and closing ----------------------------------------------------------------------


def test_a_file_registry_keeps_its_rows_across_close_and_reopen(path: Path) -> None:
    first = Registry(path)
    first.open()
    first.add_session(record("s1"))
    first.close()

    again = Registry(path)
    again.open()
    try:
        assert [r.id for r in again.sessions()] == ["s1"]
        assert again.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        again.close()


def test_the_parent_directory_is_made_private(path: Path) -> None:
    reg = Registry(path)
    reg.open()
    reg.close()
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_an_in_memory_registry_needs_no_file_and_is_not_shared() -> None:
    a, b = Registry(), Registry()
    a.open()
    b.open()
    try:
        a.add_session(record("s1"))
        assert [r.id for r in a.sessions()] == ["s1"]
        assert b.sessions() == []
    finally:
        a.close()
        b.close()


def test_a_closed_or_unopened_registry_has_no_database(path: Path) -> None:
    reg = Registry(path)
    with pytest.raises(RuntimeError):
        reg.sessions()
    reg.open()
    reg.close()
    reg.close()  # closing twice is harmless
    with pytest.raises(RuntimeError):
        reg.sessions()


# -- one orchestrator at a time ----------------------------------------------------------------


def test_a_second_registry_on_an_open_file_is_refused_until_the_first_closes(path: Path) -> None:
    first = Registry(path)
    first.open()
    with pytest.raises(RegistryError) as caught:
        Registry(path).open()
    assert "in use" in str(caught.value)
    assert caught.value.to_dict()["error_type"] == "invalid_argument"
    first.close()

    second = Registry(path)
    second.open()
    second.close()


@pytest.mark.parametrize("death", ["sigkill", "exit-without-close"])
def test_the_lock_dies_with_the_process_that_held_it(path: Path, death: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline() == "open\n"
            with pytest.raises(RegistryError):
                Registry(path).open()
            if death == "sigkill":
                child.kill()
            else:
                child.stdin.close()
            child.wait(timeout=CHILD_TIMEOUT)
        finally:
            child.kill()  # a no-op once it has exited

    reg = Registry(path)
    reg.open()
    reg.close()


# -- files that are not ours ---------------------------------------------------------------


def test_a_newer_schema_is_refused(path: Path) -> None:
    set_user_version(path, 99)
    with pytest.raises(RegistryError) as caught:
        Registry(path).open()
    assert isinstance(caught.value, InvalidArgumentError)
    assert "99" in str(caught.value)


def test_a_refused_schema_releases_the_lock(path: Path) -> None:
    set_user_version(path, 99)
    with pytest.raises(RegistryError):
        Registry(path).open()
    # The refusal must not leave this process holding the file: once the schema is one we know,
    # the next open succeeds instead of reporting the registry "in use".
    set_user_version(path, SCHEMA_VERSION)
    reg = Registry(path)
    reg.open()
    reg.close()


def test_a_file_that_is_not_sqlite_is_a_registry_error_and_frees_the_lock(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database, only text pretending to be one\n" * 100)
    for _ in range(2):  # the second attempt sees the same refusal, not "in use"
        with pytest.raises(RegistryError) as caught:
            Registry(path).open()
        assert not isinstance(caught.value, sqlite3.Error)
        assert "in use" not in str(caught.value)


# -- the orchestrator id -----------------------------------------------------------------------


def test_the_orchestrator_id_is_made_once_and_kept(registry: Registry) -> None:
    assert registry.orchestrator_id(None, "made-1") == "made-1"
    assert registry.orchestrator_id(None, "made-2") == "made-1"


def test_the_orchestrator_id_survives_a_restart(path: Path) -> None:
    first = Registry(path)
    first.open()
    first.orchestrator_id(None, "made-1")
    first.close()
    again = Registry(path)
    again.open()
    try:
        assert again.orchestrator_id(None, "made-2") == "made-1"
    finally:
        again.close()


def test_a_wanted_orchestrator_id_is_taken_on_a_fresh_registry(registry: Registry) -> None:
    assert registry.orchestrator_id("mine", "made") == "mine"
    assert registry.orchestrator_id(None, "made") == "mine"
    assert registry.orchestrator_id("mine", "made") == "mine"


def test_a_different_wanted_id_is_taken_while_no_session_is_recorded(registry: Registry) -> None:
    registry.orchestrator_id("old", "made")
    assert registry.orchestrator_id("new", "made") == "new"
    assert registry.orchestrator_id(None, "made") == "new"


def test_a_different_wanted_id_is_refused_while_sessions_are_recorded(
    registry: Registry,
) -> None:
    registry.orchestrator_id("old", "made")
    registry.add_session(record("s1"))
    with pytest.raises(RegistryError):
        registry.orchestrator_id("new", "made")
    assert registry.orchestrator_id(None, "made") == "old"
    assert registry.orchestrator_id("old", "made") == "old"


# -- sessions and the ids made inside them ---------------------------------------------------


def test_sessions_are_added_listed_in_creation_order_and_removed(registry: Registry) -> None:
    later, earlier = record("s2", minute=5), record("s1", minute=1)
    registry.add_session(later)
    registry.add_session(earlier)
    assert registry.sessions() == [earlier, later]

    registry.remove_session("s1")
    assert registry.sessions() == [later]
    registry.remove_session("absent")  # removing an unknown id is a no-op
    assert registry.sessions() == [later]


def test_a_session_record_round_trips_every_field(registry: Registry) -> None:
    full = SessionRecord(
        id="s1",
        tenant="team-b",
        task="agent-7",
        policy_json='{"name": "strict", "resources": {"memory_mb": 256}}',
        container_id="abc123",
        worker_pid=42,
        created_at=T0.isoformat(),
    )
    registry.add_session(full)
    assert registry.sessions() == [full]


def test_the_worker_pid_is_set_and_cleared(registry: Registry) -> None:
    registry.add_session(record("s1"))
    registry.set_worker_pid("s1", 1234)
    assert registry.sessions()[0].worker_pid == 1234
    registry.set_worker_pid("s1", None)
    assert registry.sessions()[0].worker_pid is None


def test_items_are_kept_per_session_and_removed_by_kind(registry: Registry) -> None:
    registry.add_session(record("s1"))
    registry.add_session(record("s2"))
    registry.add_item("terminal", "t1", "s1")
    registry.add_item("process", "p1", "s1")
    registry.add_item("terminal", "t2", "s2")
    assert sorted(registry.items("s1")) == [("process", "p1"), ("terminal", "t1")]

    registry.remove_items("s1", "terminal")
    assert registry.items("s1") == [("process", "p1")]
    assert registry.items("s2") == [("terminal", "t2")]


def test_removing_a_session_removes_its_items_and_history(registry: Registry) -> None:
    registry.add_session(record("s1"))
    registry.add_session(record("s2"))
    registry.add_item("terminal", "t1", "s1")
    registry.add_item("terminal", "t2", "s2")
    registry.add_history("s1", entry(1), keep=10)
    registry.add_history("s2", entry(1), keep=10)

    registry.remove_session("s1")

    assert registry.items("s1") == []
    assert registry.history("s1", 100) == []
    rows = registry.db.execute("SELECT session_id FROM items UNION SELECT session_id FROM history")
    assert rows.fetchall() == [("s2",)]
    assert registry.items("s2") == [("terminal", "t2")]
    assert len(registry.history("s2", 100)) == 1


# -- code history -------------------------------------------------------------------------------


def test_history_round_trips_code_and_output_with_lone_surrogates(path: Path) -> None:
    cell = HistoryEntry(1, 'print("\ud800")', T0, False, "out \udcff\n")
    reg = Registry(path)
    reg.open()
    reg.add_session(record("s1"))
    reg.add_history("s1", cell, keep=10)
    reg.close()

    again = Registry(path)
    again.open()
    try:
        assert again.history("s1", 100) == [cell]
    finally:
        again.close()


def test_history_is_listed_by_index_whatever_the_order_of_writes(registry: Registry) -> None:
    registry.add_session(record("s1"))
    for index in (3, 1, 2):
        registry.add_history("s1", entry(index, code=f"cell {index}"), keep=10)
    assert [e.index for e in registry.history("s1", 100)] == [1, 2, 3]
    assert [e.code for e in registry.history("s1", 100)] == ["cell 1", "cell 2", "cell 3"]


def test_history_keeps_only_the_newest_cells_of_that_session(registry: Registry) -> None:
    registry.add_session(record("s1"))
    registry.add_session(record("s2"))
    for index in range(1, 4):
        registry.add_history("s2", entry(index), keep=10)
    for index in range(1, 6):
        registry.add_history("s1", entry(index), keep=3)
    assert [e.index for e in registry.history("s1", 3)] == [3, 4, 5]
    assert [e.index for e in registry.history("s2", 10)] == [1, 2, 3]


def test_history_rows_past_the_cap_are_pruned_now_and_then(registry: Registry) -> None:
    registry.add_session(record("s1"))
    for index in range(1, PRUNE_EVERY * 2 + 1):
        registry.add_history("s1", entry(index), keep=3)
    rows = registry.db.execute("SELECT COUNT(*) FROM history").fetchone()[0]
    assert rows == 3  # the last cell was a pruning one
    last = PRUNE_EVERY * 2
    assert [e.index for e in registry.history("s1", 100)] == [last - 2, last - 1, last]


def test_history_is_cleared_per_session(registry: Registry) -> None:
    registry.add_session(record("s1"))
    registry.add_session(record("s2"))
    registry.add_history("s1", entry(1), keep=10)
    registry.add_history("s2", entry(1), keep=10)
    registry.clear_history("s1")
    assert registry.history("s1", 100) == []
    assert len(registry.history("s2", 100)) == 1


def test_a_sessions_env_round_trips_and_goes_with_its_row(registry: Registry) -> None:
    env = {"API_TOKEN": "t0ken", "EMPTY": "", "UNICODE": "é ✓"}
    with_env = dataclasses.replace(record("s1"), env=env)
    registry.add_session(with_env)
    registry.add_session(record("s2"))
    assert {r.id: dict(r.env) for r in registry.sessions()} == {"s1": env, "s2": {}}
    registry.remove_session("s1")
    assert registry.db.execute("SELECT COUNT(*) FROM session_env").fetchone()[0] == 0


def test_a_stored_env_that_is_not_a_map_of_strings_is_a_registry_error(
    registry: Registry,
) -> None:
    registry.add_session(record("s1"))
    registry.db.execute("INSERT INTO session_env VALUES ('s1', '{\"A\": 1}')")
    with pytest.raises(RegistryError):
        registry.sessions()


def test_the_registry_file_is_readable_by_its_owner_only(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.touch(mode=0o644)
    path.chmod(0o644)
    reg = Registry(path)
    reg.open()
    try:
        reg.add_session(record("s1"))
    finally:
        reg.close()
    assert path.stat().st_mode & 0o777 == 0o600
