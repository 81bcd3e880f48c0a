"""The registry's schema 2: session settings (metadata, lifetime end, end action) and the E2B
port's sandbox and command rows, kept across a reopen, gone with their session, and a
version-1 file opened without losing a row."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.errors import RegistryError
from orchestrator.registry.store import (
    SCHEMA_VERSION,
    E2bCommandRecord,
    E2bRecord,
    Registry,
    SessionRecord,
    SessionSettings,
)
from orchestrator.session.history import HistoryEntry

# Schema 1 as it was released: what a registry written before settings and E2B rows holds.
SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, task TEXT, policy_json TEXT NOT NULL,
    container_id TEXT NOT NULL UNIQUE, worker_pid INTEGER, created_at TEXT NOT NULL
);
CREATE TABLE session_env (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    env_json TEXT NOT NULL
);
CREATE TABLE items (
    kind TEXT NOT NULL, item_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    PRIMARY KEY (kind, item_id)
);
CREATE TABLE history (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL, code BLOB NOT NULL, success INTEGER NOT NULL, output BLOB NOT NULL,
    timestamp TEXT NOT NULL, PRIMARY KEY (session_id, seq)
);
INSERT INTO sessions VALUES ('old', 'team-a', NULL, '{"name": "default"}', 'c-old', 7,
    '2024-05-01T12:00:00+00:00');
INSERT INTO session_env VALUES ('old', '{"A": "1"}');
INSERT INTO items VALUES ('process', 'p1', 'old');
PRAGMA user_version = 1;
"""


def session(session_id: str) -> SessionRecord:
    return SessionRecord(
        id=session_id,
        tenant="team-a",
        task=None,
        policy_json='{"name": "default"}',
        container_id=f"c-{session_id}",
        worker_pid=None,
        created_at="2024-05-01T12:00:00+00:00",
    )


def sandbox(sandbox_id: str, session_id: str, tenant: str = "team-a") -> E2bRecord:
    return E2bRecord(
        sandbox_id=sandbox_id,
        session_id=session_id,
        tenant=tenant,
        template="base",
        policy="shell",
        access_token="token-" + sandbox_id,
        envs={"E": "1"},
        options={"auto_resume": True},
        started_at="2024-05-01T12:00:0" + sandbox_id[-1] + "Z",
        next_pid=1000,
    )


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


def reopened(registry: Registry) -> Registry:
    registry.close()
    registry.open()
    return registry


def test_a_version_1_registry_opens_with_every_row_and_is_brought_to_the_new_schema(
    path: Path,
) -> None:
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.close()
    reg = Registry(path)
    reg.open()
    try:
        (old,) = reg.sessions()
        assert (old.id, old.worker_pid, dict(old.env), old.settings) == ("old", 7, {"A": "1"}, None)
        assert reg.items("old") == [("process", "p1")]
        assert reg.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        reg.set_settings("old", SessionSettings(metadata={"k": "v"}, ends_at=5.0))
        assert reopened(reg).sessions()[0].settings == SessionSettings(
            metadata={"k": "v"}, ends_at=5.0
        )
    finally:
        reg.close()


def test_settings_are_kept_replaced_and_go_with_their_session(registry: Registry) -> None:
    registry.add_session(session("s1"))
    registry.add_session(session("s2"))
    assert [r.settings for r in registry.sessions()] == [None, None]
    registry.set_settings("s1", SessionSettings(metadata={"a": "1"}))
    wanted = SessionSettings(
        metadata={"a": "2"}, ends_at=1_700_000_000.5, lifetime_s=30.0, end_action="pause"
    )
    registry.set_settings("s1", wanted)
    by_id = {r.id: r.settings for r in reopened(registry).sessions()}
    assert by_id == {"s1": wanted, "s2": None}
    registry.remove_session("s1")
    registry.set_settings("s1", wanted)  # ended meanwhile: nothing is written
    assert registry.db.execute("SELECT COUNT(*) FROM session_settings").fetchone()[0] == 0


def test_an_e2b_sandbox_and_its_commands_survive_a_reopen(registry: Registry) -> None:
    registry.add_session(session("s1"))
    registry.add_e2b(sandbox("sbx1", "s1"))
    spec = {"cmd": "/bin/bash", "args": ["-c", "ls"], "pty": False}
    registry.add_e2b_command("sbx1", E2bCommandRecord(pid=1000, terminal_id="t1", spec=spec))
    registry.add_e2b_command("sbx1", E2bCommandRecord(pid=1001, terminal_id="t2", spec={}))
    found = reopened(registry).e2b("sbx1")
    assert found is not None
    assert (found.session_id, found.access_token, dict(found.envs)) == (
        "s1",
        "token-sbx1",
        {"E": "1"},
    )
    assert dict(found.options) == {"auto_resume": True}
    assert found.next_pid == 1002
    assert [(c.pid, c.terminal_id, dict(c.spec)) for c in found.commands] == [
        (1000, "t1", spec),
        (1001, "t2", {}),
    ]
    assert registry.e2b_id_taken("sbx1") and not registry.e2b_id_taken("sbx2")


def test_e2b_rows_go_with_their_session_and_are_listed_per_tenant(registry: Registry) -> None:
    for n in ("1", "2", "3"):
        registry.add_session(session(f"s{n}"))
    registry.add_e2b(sandbox("sbx1", "s1"))
    registry.add_e2b(sandbox("sbx2", "s2"))
    registry.add_e2b(sandbox("sbx3", "s3", tenant="team-b"))
    registry.add_e2b_command("sbx1", E2bCommandRecord(pid=1000, terminal_id="t", spec={}))
    assert registry.e2b_ids("team-a") == ["sbx1", "sbx2"]
    registry.remove_session("s1")
    assert registry.e2b("sbx1") is None
    assert registry.db.execute("SELECT COUNT(*) FROM e2b_commands").fetchone()[0] == 0
    registry.remove_e2b("sbx2")
    assert registry.e2b_ids("team-a") == []
    assert registry.e2b_ids("team-b") == ["sbx3"]


def test_rows_written_for_a_session_that_just_ended_are_dropped_not_refused(
    registry: Registry,
) -> None:
    """A terminal made, a cell recorded or an E2B command started while its session was being
    ended: the write finds no session row and keeps nothing (the foreign keys would refuse it
    and the call would answer internal)."""
    registry.add_session(session("s1"))
    registry.add_e2b(sandbox("sbx1", "s1"))
    registry.remove_session("s1")
    registry.add_item("terminal", "t1", "s1")
    cell = HistoryEntry(index=1, code="1", timestamp=datetime.now(UTC), success=True, output="")
    registry.add_history("s1", cell, keep=10)
    registry.add_e2b_command("sbx1", E2bCommandRecord(pid=1000, terminal_id="t", spec={}))
    for table in ("items", "history", "e2b_commands"):
        assert registry.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0


def test_an_e2b_row_needs_its_session(registry: Registry) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        registry.add_e2b(sandbox("sbx1", "no-such-session"))


def test_a_hand_edited_e2b_row_is_a_registry_error(registry: Registry) -> None:
    registry.add_session(session("s1"))
    registry.add_e2b(sandbox("sbx1", "s1"))
    registry.db.execute("UPDATE e2b_sandboxes SET options_json = '[1]'")
    with pytest.raises(RegistryError):
        registry.e2b("sbx1")


def test_settings_go_through_the_registry_and_back_onto_a_session() -> None:
    """``settings_of`` and ``restore_settings`` (``_core.session_table``): an end kept on the
    wall clock comes back on the monotonic one; a session its end had paused (no end kept)
    comes back with its lifetime again, as a resume would give it."""
    import time
    from types import SimpleNamespace
    from typing import Any

    from orchestrator._core.session_table import restore_settings, settings_of

    before: Any = SimpleNamespace(
        metadata={"k": "v"},
        ends_at=time.monotonic() + 100.0,
        lifetime_s=100.0,
        lifetime_end_action="pause",
    )
    kept = settings_of(before)
    assert kept.end_action == "pause" and kept.ends_at is not None
    assert abs(kept.ends_at - (time.time() + 100.0)) < 1.0
    after: Any = SimpleNamespace(
        metadata={}, ends_at=None, lifetime_s=None, lifetime_end_action="end"
    )
    restore_settings(after, kept)
    assert after.metadata == {"k": "v"} and after.lifetime_end_action == "pause"
    assert abs(after.ends_at - before.ends_at) < 1.0

    paused: Any = SimpleNamespace(
        metadata={}, ends_at=None, lifetime_s=None, lifetime_end_action="end"
    )
    restore_settings(paused, SessionSettings(ends_at=None, lifetime_s=30.0, end_action="pause"))
    assert 25.0 < paused.ends_at - time.monotonic() <= 30.0

    untouched: Any = SimpleNamespace(
        metadata={}, ends_at=None, lifetime_s=None, lifetime_end_action="end"
    )
    restore_settings(untouched, None)  # a session of a version-1 registry
    assert untouched.ends_at is None and untouched.lifetime_end_action == "end"
