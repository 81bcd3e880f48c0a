"""The registry on disk: what a restarted orchestrator needs to re-adopt its sessions.

One SQLite file (WAL, every write its own transaction) holds this orchestrator's id, its sessions
(owner, the effective policy they were created under, container, REPL worker pid, the env given
at creation, and their settings: metadata, the end a ``set_timeout`` gave and what happens then),
the ids made inside them (processes, terminals), their code history, the tenants' snapshots
(owner, policy name, image, size, env and metadata: ``_core.snapshots``), and the E2B port's ids
beside its sessions (``E2bRecord``: sandbox id, access token, the commands it numbered). The env
is kept because a re-adopted session must give it to every process it starts after a restart;
its values may be secrets, as code may be: the file is made 0600, in a directory made 0700.

A crash between two writes leaves the state after the first: a session row is written once its
container and worker are ready and deleted before its container is removed, so a container
without a row is unknown (reaped on the next start) and a row without a container is forgotten
then.

One orchestrator at a time: the file is locked (``flock`` on ``<path>.lock``) for as long as the
registry is open, and the lock dies with the process, ``kill -9`` included. Without a path the
registry lives in memory and nothing survives the process (the library default).

Schema versions: 1 had no settings and no E2B tables; 2 adds them (``CREATE TABLE IF NOT
EXISTS``), so a version-1 file opens, keeps every row and reads as sessions without settings.

Calls are synchronous: a write is a few tens of microseconds in WAL mode without an fsync per
commit (``synchronous=NORMAL``: a power loss may drop the last commits, never corrupt the file).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from orchestrator.errors import RegistryError, StorageFullError
from orchestrator.session.history import HistoryEntry

__all__ = [
    "PRUNE_EVERY",
    "SCHEMA_VERSION",
    "E2bCommandRecord",
    "E2bRecord",
    "Registry",
    "SessionRecord",
    "SessionSettings",
    "SnapshotRecord",
    "read_owners",
]

SCHEMA_VERSION = 2
# Versions a file may be at and still be opened (and brought to SCHEMA_VERSION).
READABLE_VERSIONS = frozenset({0, 1, SCHEMA_VERSION})
# History rows beyond a session's cap are deleted once every this many cells.
PRUNE_EVERY = 32
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    task TEXT,
    policy_json TEXT NOT NULL,
    container_id TEXT NOT NULL UNIQUE,
    worker_pid INTEGER,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_env (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    env_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    kind TEXT NOT NULL,
    item_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    PRIMARY KEY (kind, item_id)
);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    task TEXT,
    policy TEXT NOT NULL,
    image TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    env_json TEXT NOT NULL,
    metadata_json TEXT NOT NULL,
    source_session TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_settings (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    metadata_json TEXT NOT NULL,
    ends_at REAL,
    lifetime_s REAL,
    end_action TEXT
);
CREATE TABLE IF NOT EXISTS e2b_sandboxes (
    sandbox_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL UNIQUE REFERENCES sessions(id) ON DELETE CASCADE,
    tenant TEXT NOT NULL,
    template TEXT NOT NULL,
    policy TEXT NOT NULL,
    access_token TEXT NOT NULL,
    envs_json TEXT NOT NULL,
    options_json TEXT NOT NULL,
    started_at TEXT NOT NULL,
    next_pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS e2b_commands (
    sandbox_id TEXT NOT NULL REFERENCES e2b_sandboxes(sandbox_id) ON DELETE CASCADE,
    pid INTEGER NOT NULL,
    terminal_id TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, pid)
);
CREATE TABLE IF NOT EXISTS history (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    code BLOB NOT NULL,
    success INTEGER NOT NULL,
    output BLOB NOT NULL,
    timestamp TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""


@dataclass(frozen=True, kw_only=True)
class SessionRecord:
    id: str
    tenant: str
    task: str | None
    policy_json: str
    container_id: str
    worker_pid: int | None
    created_at: str
    env: Mapping[str, str] = field(default_factory=dict)
    settings: SessionSettings | None = None


@dataclass(frozen=True, kw_only=True)
class SessionSettings:
    """What a running session was given beside its policy and env: its metadata, the end a
    ``set_timeout`` gave it (wall clock, seconds since the epoch: a monotonic clock does not
    survive a restart; None: its policy's lifetime), the lifetime that end was set with (a
    resume after a pause at the end gives it again) and what the end does (None: the core's
    default, the session ends)."""

    metadata: Mapping[str, str] = field(default_factory=dict)
    ends_at: float | None = None
    lifetime_s: float | None = None
    end_action: str | None = None


@dataclass(frozen=True, kw_only=True)
class E2bCommandRecord:
    """One command an E2B sandbox started: its envd pid, its terminal, and what the SDK
    started it with (a JSON object the E2B port reads back)."""

    pid: int
    terminal_id: str
    spec: Mapping[str, object]


@dataclass(frozen=True, kw_only=True)
class E2bRecord:
    """An E2B sandbox: its id and access token beside the session it is, and what the E2B port
    keeps of its creation (template, policy, envs, options such as ``auto_resume``)."""

    sandbox_id: str
    session_id: str
    tenant: str
    template: str
    policy: str
    access_token: str
    envs: Mapping[str, str]
    options: Mapping[str, object]
    started_at: str
    next_pid: int
    commands: tuple[E2bCommandRecord, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SnapshotRecord:
    """A session's snapshot: its image and what a session made from it is given again."""

    id: str
    tenant: str
    task: str | None
    policy: str
    image: str
    size_bytes: int
    env: Mapping[str, str]
    metadata: Mapping[str, str]
    source_session: str
    created_at: str


class Registry:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_fd = _lock(Path(f"{self.path}.lock"))
        db: sqlite3.Connection | None = None
        try:
            if self.path is not None:
                _private(self.path)
            db = sqlite3.connect(
                self.path or ":memory:", isolation_level=None, check_same_thread=False
            )
            # The version first: a file we refuse is left exactly as it was.
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in READABLE_VERSIONS:
                raise RegistryError(f"{self.path}: registry schema {version} is not supported")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException as exc:
            if db is not None:
                db.close()
            self.close()  # the lock too, on every failure
            if isinstance(exc, sqlite3.Error):
                raise RegistryError(f"{self.path}: cannot open the registry: {exc}") from None
            raise
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the registry is not open")
        return self._db

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; a disk that refuses it (full, failing) is ``StorageFullError``
        naming the file, and the file is left as it was (SQLite rolls the transaction back)."""
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite ends some failed transactions itself
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if _refused_by_disk(exc):
                raise StorageFullError(
                    f"{self.path}: the registry's disk refused a write ({exc})",
                    hint="free space in sandhold's data directory",
                ) from exc
            raise

    def orchestrator_id(self, wanted: str | None, new_id: str) -> str:
        """The id on this orchestrator's containers: the registry's, made once (``new_id``) and
        kept, so a restart recognises its own. A different ``wanted`` id is refused: the
        registry's rows describe the containers of the id it holds."""
        with self._transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'orchestrator_id'").fetchone()
            stored = row[0] if row else None
            has_sessions = db.execute("SELECT 1 FROM sessions LIMIT 1").fetchone() is not None
            if stored is not None and wanted not in (None, stored) and has_sessions:
                raise RegistryError(
                    f"{self.path}: the registry belongs to orchestrator {stored!r}, not "
                    f"{wanted!r}; give each orchestrator id its own registry"
                )
            chosen = wanted or stored or new_id
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('orchestrator_id', ?)", (chosen,)
            )
        return chosen

    def probe_write(self) -> None:
        """Write and commit one row (the time of the probe), for a readiness check: a full disk
        or a file or directory made read-only is a ``RegistryError`` here, before a session's
        row is refused."""
        try:
            with self._transaction() as db:
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('ready_probe', ?)",
                    (repr(time.time()),),
                )
        except sqlite3.Error as exc:
            raise RegistryError(f"{self.path}: cannot write to the registry: {exc}") from None
        except StorageFullError as exc:
            raise RegistryError(f"{self.path}: cannot write to the registry: {exc}") from None

    def stored_orchestrator_id(self) -> str | None:
        """The orchestrator id this registry holds, if one was ever chosen."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'orchestrator_id'").fetchone()
        return str(row[0]) if row else None

    # -- sessions ---------------------------------------------------------------------------

    def add_session(self, record: SessionRecord) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.tenant,
                    record.task,
                    record.policy_json,
                    record.container_id,
                    record.worker_pid,
                    record.created_at,
                ),
            )
            if record.env:
                db.execute(
                    "INSERT INTO session_env VALUES (?, ?)", (record.id, json.dumps(record.env))
                )

    def set_worker_pid(self, session_id: str, pid: int | None) -> None:
        with self._transaction() as db:
            db.execute("UPDATE sessions SET worker_pid = ? WHERE id = ?", (pid, session_id))

    def remove_session(self, session_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def set_settings(self, session_id: str, settings: SessionSettings) -> None:
        """Keep ``settings`` for the session (replacing any before); nothing when it has no
        row (it ended meanwhile)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO session_settings "
                "SELECT id, ?, ?, ?, ? FROM sessions WHERE id = ?",
                (
                    json.dumps(dict(settings.metadata)),
                    settings.ends_at,
                    settings.lifetime_s,
                    settings.end_action,
                    session_id,
                ),
            )

    def sessions(self) -> list[SessionRecord]:
        rows = self.db.execute(
            "SELECT id, tenant, task, policy_json, container_id, worker_pid, created_at, env_json, "
            "metadata_json, ends_at, lifetime_s, end_action FROM sessions "
            "LEFT JOIN session_env ON session_env.session_id = sessions.id "
            "LEFT JOIN session_settings ON session_settings.session_id = sessions.id "
            "ORDER BY created_at"
        ).fetchall()
        return [
            SessionRecord(
                id=r[0],
                tenant=r[1],
                task=r[2],
                policy_json=r[3],
                container_id=r[4],
                worker_pid=r[5],
                created_at=r[6],
                env=_env(r[7]),
                settings=_settings(r[8], r[9], r[10], r[11]),
            )
            for r in rows
        ]

    # -- E2B sandboxes (``orchestrator.http.e2b``) -------------------------------------------

    def add_e2b(self, record: E2bRecord) -> None:
        """The sandbox's row; it goes with its session's (a foreign key)."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO e2b_sandboxes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.sandbox_id,
                    record.session_id,
                    record.tenant,
                    record.template,
                    record.policy,
                    record.access_token,
                    json.dumps(dict(record.envs)),
                    json.dumps(dict(record.options)),
                    record.started_at,
                    record.next_pid,
                ),
            )

    def e2b(self, sandbox_id: str) -> E2bRecord | None:
        """The sandbox with its commands, or None (never made, or its session ended)."""
        row = self.db.execute(
            "SELECT sandbox_id, session_id, tenant, template, policy, access_token, envs_json, "
            "options_json, started_at, next_pid FROM e2b_sandboxes WHERE sandbox_id = ?",
            (sandbox_id,),
        ).fetchone()
        if row is None:
            return None
        commands = self.db.execute(
            "SELECT pid, terminal_id, spec_json FROM e2b_commands WHERE sandbox_id = ? "
            "ORDER BY pid",
            (sandbox_id,),
        ).fetchall()
        return E2bRecord(
            sandbox_id=row[0],
            session_id=row[1],
            tenant=row[2],
            template=row[3],
            policy=row[4],
            access_token=row[5],
            envs=_env(row[6]),
            options=_object(row[7]),
            started_at=row[8],
            next_pid=row[9],
            commands=tuple(
                E2bCommandRecord(pid=c[0], terminal_id=c[1], spec=_object(c[2])) for c in commands
            ),
        )

    def e2b_ids(self, tenant: str) -> list[str]:
        """The tenant's sandbox ids, oldest first."""
        rows = self.db.execute(
            "SELECT sandbox_id FROM e2b_sandboxes WHERE tenant = ? ORDER BY started_at, sandbox_id",
            (tenant,),
        ).fetchall()
        return [r[0] for r in rows]

    def e2b_id_taken(self, sandbox_id: str) -> bool:
        found = self.db.execute(
            "SELECT 1 FROM e2b_sandboxes WHERE sandbox_id = ?", (sandbox_id,)
        ).fetchone()
        return found is not None

    def add_e2b_command(self, sandbox_id: str, command: E2bCommandRecord) -> None:
        """The command's row, and the sandbox's next pid past it, in one transaction; nothing
        when the sandbox has no row (its session ended while the command started)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO e2b_commands "
                "SELECT sandbox_id, ?, ?, ? FROM e2b_sandboxes WHERE sandbox_id = ?",
                (command.pid, command.terminal_id, json.dumps(dict(command.spec)), sandbox_id),
            )
            db.execute(
                "UPDATE e2b_sandboxes SET next_pid = MAX(next_pid, ?) WHERE sandbox_id = ?",
                (command.pid + 1, sandbox_id),
            )

    def remove_e2b_commands(self, sandbox_id: str, pids: list[int] | None = None) -> None:
        """The sandbox's command rows of ``pids`` (None: all); its next pid stays."""
        with self._transaction() as db:
            if pids is None:
                db.execute("DELETE FROM e2b_commands WHERE sandbox_id = ?", (sandbox_id,))
            else:
                db.executemany(
                    "DELETE FROM e2b_commands WHERE sandbox_id = ? AND pid = ?",
                    [(sandbox_id, pid) for pid in pids],
                )

    def remove_e2b(self, sandbox_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM e2b_sandboxes WHERE sandbox_id = ?", (sandbox_id,))

    # -- snapshots -------------------------------------------------------------------------

    def add_snapshot(self, record: SnapshotRecord) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.tenant,
                    record.task,
                    record.policy,
                    record.image,
                    record.size_bytes,
                    json.dumps(dict(record.env)),
                    json.dumps(dict(record.metadata)),
                    record.source_session,
                    record.created_at,
                ),
            )

    def remove_snapshot(self, snapshot_id: str) -> bool:
        """Delete the row; False when there was none."""
        with self._transaction() as db:
            return db.execute("DELETE FROM snapshots WHERE id = ?", (snapshot_id,)).rowcount > 0

    def snapshots(self, tenant: str | None = None) -> list[SnapshotRecord]:
        """Every snapshot (of ``tenant`` only, when given), oldest first."""
        query = (
            "SELECT id, tenant, task, policy, image, size_bytes, env_json, metadata_json, "
            "source_session, created_at FROM snapshots"
        )
        where, args = ("", ()) if tenant is None else (" WHERE tenant = ?", (tenant,))
        rows = self.db.execute(f"{query}{where} ORDER BY created_at, id", args).fetchall()
        return [
            SnapshotRecord(
                id=r[0],
                tenant=r[1],
                task=r[2],
                policy=r[3],
                image=r[4],
                size_bytes=r[5],
                env=_env(r[6]),
                metadata=_env(r[7]),
                source_session=r[8],
                created_at=r[9],
            )
            for r in rows
        ]

    # -- ids made inside sessions ----------------------------------------------------------

    def add_item(self, kind: str, item_id: str, session_id: str) -> None:
        """Nothing when the session has no row (it ended while the item was being made): a row
        for it would only be swept again, and the foreign key refuses it."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO items SELECT ?, ?, id FROM sessions WHERE id = ?",
                (kind, item_id, session_id),
            )

    def items(self, session_id: str) -> list[tuple[str, str]]:
        rows = self.db.execute(
            "SELECT kind, item_id FROM items WHERE session_id = ?", (session_id,)
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def remove_items(self, session_id: str, kind: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM items WHERE session_id = ? AND kind = ?", (session_id, kind))

    # -- code history ----------------------------------------------------------------------

    def add_history(self, session_id: str, entry: HistoryEntry, *, keep: int) -> None:
        """Record one cell. Only the newest ``keep`` are read back; older rows are pruned every
        ``PRUNE_EVERY`` cells (a delete per cell would double the cost of every execute).
        Nothing when the session has no row (it ended while the cell ran)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO history "
                "SELECT id, ?, ?, ?, ?, ? FROM sessions WHERE id = ?",
                (
                    entry.index,
                    _blob(entry.code),
                    _outcome_code(entry),
                    _blob(entry.output),
                    entry.timestamp.isoformat(),
                    session_id,
                ),
            )
            if entry.index % PRUNE_EVERY == 0:
                db.execute(
                    "DELETE FROM history WHERE session_id = ? AND seq <= ?",
                    (session_id, entry.index - keep),
                )

    def clear_history(self, session_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM history WHERE session_id = ?", (session_id,))

    def history(self, session_id: str, keep: int) -> list[HistoryEntry]:
        """The newest ``keep`` cells, oldest first."""
        rows = self.db.execute(
            "SELECT seq, code, timestamp, success, output FROM history WHERE session_id = ? "
            "ORDER BY seq DESC LIMIT ?",
            (session_id, keep),
        ).fetchall()
        rows.reverse()
        return [
            HistoryEntry(
                r[0],
                _text(r[1]),
                datetime.fromisoformat(r[2]),
                r[3] == SUCCESS_OK,
                _text(r[4]),
                cancelled=r[3] == SUCCESS_CANCELLED,
            )
            for r in rows
        ]


def read_owners(path: Path) -> dict[str, tuple[str, str | None]]:
    """Session id -> (tenant, task) from a registry file, read-only and without its lock (a
    running orchestrator may hold it: WAL lets a reader in). Empty when there is no registry."""
    if not path.is_file():
        return {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT id, tenant, task FROM sessions").fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise RegistryError(f"{path}: cannot read the registry: {exc}") from None
    return {r[0]: (r[1], r[2]) for r in rows}


# SQLite's primary result codes for a write its disk refused (the low byte of an extended code).
_DISK_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


def _refused_by_disk(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _DISK_CODES
    return "disk" in str(exc)


def _env(env_json: str | None) -> dict[str, str]:
    """A stored env; one that is not a map of strings (a hand-edited file) is a RegistryError,
    since re-adopting the session without its env would break its contract silently."""
    if env_json is None:
        return {}
    try:
        env = json.loads(env_json)
    except ValueError:
        env = None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise RegistryError("a session's stored env is not a map of strings")
    return env


def _object(raw: str) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RegistryError("a stored E2B record is not a JSON object")
    return value


def _settings(
    metadata_json: str | None,
    ends_at: float | None,
    lifetime_s: float | None,
    end_action: str | None,
) -> SessionSettings | None:
    """A session's stored settings; None for a session that has none (a version-1 row)."""
    if metadata_json is None:
        return None
    return SessionSettings(
        metadata=_env(metadata_json), ends_at=ends_at, lifetime_s=lifetime_s, end_action=end_action
    )


# Code and output are kept as bytes: they may hold lone surrogates, which SQLite text cannot.
def _blob(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _private(path: Path) -> None:
    """The file, made if need be, readable by its owner only (SQLite gives its WAL and shared
    memory files the database file's mode)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise RegistryError(f"{path}: cannot open the registry: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RegistryError(
            f"{path.with_suffix('')}: the registry is in use by another running sandhold"
        ) from None
    return fd


# The history table's ``success`` column holds the outcome: 1 ok, 0 error, 2 cancelled (the
# values 0 and 1 are those it held before cancelled cells were kept: old rows read the same).
SUCCESS_ERROR = 0
SUCCESS_OK = 1
SUCCESS_CANCELLED = 2


def _outcome_code(entry: HistoryEntry) -> int:
    if entry.cancelled:
        return SUCCESS_CANCELLED
    return SUCCESS_OK if entry.success else SUCCESS_ERROR
