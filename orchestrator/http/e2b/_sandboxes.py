"""The E2B sandboxes this server made: what the E2B port keeps beside each sandhold session it is,
and nothing the core keeps. Here: the sandbox id ↔ session id, its access token, the template
and policy it was made from, its envs and E2B options (``auto_resume``), and the envd pids ↔
terminals of the commands started through it. There: everything about the session's life (its
lifetime, its end action, paused or running, its metadata), read from the core when asked.

Invariants: every row is written through to the registry (``registry.store``, the tables
``e2b_sandboxes`` and ``e2b_commands``) before an answer names it, so a sandbox survives a
``kill -9`` of ``serve`` exactly as long as its session does (its rows go with the session's
row). A sandbox is found only by its own tenant (control API) or with its own access token
(data plane); an unknown id, another tenant's id and a wrong token give the same ``None``, so
an answer tells nothing about which. The objects here are a cache of the rows: one whose row
is gone (its session ended) is dropped when it is next looked up. A sandbox read back from the
registry (after a restart) has no commands: the restart's sweep ended their terminals; its
pids go on from where they were."""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import secrets
import string
from collections.abc import Callable
from typing import Any, Final

from orchestrator.registry.store import E2bCommandRecord, E2bRecord, Registry

__all__ = ["FIRST_PID", "Command", "E2bSandbox", "SandboxTable", "utc_now"]

# E2B's ids are 20 lowercase letters and digits; clients and their logs expect that shape.
_ID_ALPHABET: Final = string.ascii_lowercase + string.digits
_ID_CHARS: Final = 20
# envd numbers its processes by their pid; ours count from here so they look like pids.
FIRST_PID: Final = 1000
# The fields of ``Command`` kept as its spec (the rest are its pid and terminal).
_SPEC_FIELDS: Final = ("cmd", "args", "envs", "cwd", "tag", "pty", "stderr_marker")


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass
class Command:
    """One command or PTY started through the process service: its terminal and what the SDK
    started it with (``List`` answers it back)."""

    pid: int
    terminal_id: str
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    pty: bool
    stderr_marker: str | None = None

    def record(self) -> E2bCommandRecord:
        spec = {name: getattr(self, name) for name in _SPEC_FIELDS}
        return E2bCommandRecord(pid=self.pid, terminal_id=self.terminal_id, spec=spec)


class Commands(dict[int, Command]):
    """A sandbox's commands by pid; one taken out (``pop``, ``del``) leaves the registry too."""

    on_remove: Callable[[int], None] | None = None

    def pop(self, pid: int, *default: Any) -> Any:
        found = super().pop(pid, *default)
        if self.on_remove is not None and found is not None:
            self.on_remove(pid)
        return found

    def __delitem__(self, pid: int) -> None:
        super().__delitem__(pid)
        if self.on_remove is not None:
            self.on_remove(pid)


@dataclasses.dataclass
class E2bSandbox:
    sandbox_id: str
    tenant: str
    session_id: str
    template: str
    policy: str
    access_token: str
    envs: dict[str, str]
    started_at: datetime.datetime
    # E2B's ``autoResume``: a data-plane request wakes the sandbox when it is paused.
    auto_resume: bool = False
    commands: Commands = dataclasses.field(default_factory=Commands)
    next_pid: int = FIRST_PID
    # The interpreter's execution count (memory only: a restart starts it again).
    executions: int = 0
    # Writes a new command through to the registry (set by the table).
    on_command: Callable[[Command], None] | None = dataclasses.field(default=None, repr=False)

    def add_command(self, **fields: object) -> Command:
        pid = self.next_pid
        command = Command(pid=pid, **fields)  # type: ignore[arg-type]
        if self.on_command is not None:
            self.on_command(command)
        self.next_pid = pid + 1
        self.commands[pid] = command
        return command

    def record(self) -> E2bRecord:
        return E2bRecord(
            sandbox_id=self.sandbox_id,
            session_id=self.session_id,
            tenant=self.tenant,
            template=self.template,
            policy=self.policy,
            access_token=self.access_token,
            envs=dict(self.envs),
            options={"auto_resume": self.auto_resume},
            started_at=self.started_at.isoformat(),
            next_pid=self.next_pid,
        )

    @classmethod
    def from_record(cls, record: E2bRecord) -> E2bSandbox:
        """The sandbox as the registry kept it, without its commands: read back only after a
        restart, whose sweep ended every terminal they ran in (their pids are not reused)."""
        return cls(
            sandbox_id=record.sandbox_id,
            tenant=record.tenant,
            session_id=record.session_id,
            template=record.template,
            policy=record.policy,
            access_token=record.access_token,
            envs=dict(record.envs),
            started_at=datetime.datetime.fromisoformat(record.started_at),
            auto_resume=record.options.get("auto_resume") is True,
            next_pid=record.next_pid,
        )


class SandboxTable:
    """The sandboxes, read from and written through to ``registry()`` (a callable: the core
    may swap its registry while it starts)."""

    def __init__(self, registry: Callable[[], Registry]) -> None:
        self._registry = registry
        self._cache: dict[str, E2bSandbox] = {}

    def new_id(self) -> str:
        while True:
            sandbox_id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_CHARS))
            if not self._registry().e2b_id_taken(sandbox_id):
                return sandbox_id

    def add(self, sandbox: E2bSandbox) -> None:
        """Written to the registry first: a sandbox whose row was refused is never handed out."""
        self._registry().add_e2b(sandbox.record())
        self._track(sandbox)

    def remove(self, sandbox_id: str) -> None:
        self._cache.pop(sandbox_id, None)
        self._registry().remove_e2b(sandbox_id)

    def _track(self, sandbox: E2bSandbox) -> None:
        registry, sandbox_id = self._registry, sandbox.sandbox_id
        sandbox.on_command = lambda c: registry().add_e2b_command(sandbox_id, c.record())
        sandbox.commands.on_remove = lambda pid: registry().remove_e2b_commands(sandbox_id, [pid])
        self._cache[sandbox_id] = sandbox

    def _get(self, sandbox_id: str) -> E2bSandbox | None:
        """The sandbox while its row exists: cached, or read back (after a restart)."""
        registry = self._registry()
        cached = self._cache.get(sandbox_id)
        if cached is not None:
            if registry.e2b_id_taken(sandbox_id):
                return cached
            del self._cache[sandbox_id]  # its session ended: the row went with it
            return None
        record = registry.e2b(sandbox_id)
        if record is None:
            return None
        sandbox = E2bSandbox.from_record(record)
        if record.commands:
            registry.remove_e2b_commands(sandbox_id)
        self._track(sandbox)
        return sandbox

    def of_tenant(self, sandbox_id: str, tenant: str) -> E2bSandbox | None:
        found = self._get(sandbox_id)
        return found if found is not None and found.tenant == tenant else None

    def with_token(self, sandbox_id: str, token: str | None) -> E2bSandbox | None:
        found = self._get(sandbox_id)
        expected = found.access_token if found is not None else "-" * 43
        matches = hmac.compare_digest(expected.encode(), (token or "").encode())
        return found if found is not None and matches else None

    def listed(self, tenant: str) -> list[E2bSandbox]:
        """The tenant's sandboxes whose rows exist, oldest first."""
        found = (self._get(i) for i in self._registry().e2b_ids(tenant))
        return [s for s in found if s is not None]
