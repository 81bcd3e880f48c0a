"""The E2B sandboxes this server made: each one a sandhold session, with what E2B keeps beside it
(template, metadata, envs, lifetime, access token, the commands started through it).

Invariants: the table lives in memory only (a restarted server knows no E2B sandbox; their
sessions are re-adopted or reaped by sandhold as usual). A sandbox is found only by its own
tenant (control API) or with its own access token (data plane); an unknown id, another
tenant's id and a wrong token give the same ``None``, so an answer tells nothing about which."""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import secrets
import string
from typing import Final, Literal

__all__ = ["Command", "E2bSandbox", "SandboxTable", "utc_now"]

# E2B's ids are 20 lowercase letters and digits; clients and their logs expect that shape.
_ID_ALPHABET: Final = string.ascii_lowercase + string.digits
_ID_CHARS: Final = 20
# envd numbers its processes by their pid; ours count from here so they look like pids.
FIRST_PID: Final = 1000

State = Literal["running", "paused"]


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


@dataclasses.dataclass
class E2bSandbox:
    sandbox_id: str
    tenant: str
    session_id: str
    template: str
    policy: str
    access_token: str
    metadata: dict[str, str]
    envs: dict[str, str]
    started_at: datetime.datetime
    end_at: datetime.datetime
    state: State = "running"
    # The lifetime last asked for: a resume without a timeout of its own runs for this long.
    timeout_s: int = 300
    # E2B's ``autoPause``: when the lifetime runs out, the sandbox is paused, not killed.
    auto_pause: bool = False
    commands: dict[int, Command] = dataclasses.field(default_factory=dict)
    next_pid: int = FIRST_PID
    executions: int = 0

    def add_command(self, **fields: object) -> Command:
        pid = self.next_pid
        self.next_pid += 1
        command = Command(pid=pid, **fields)  # type: ignore[arg-type]
        self.commands[pid] = command
        return command

    def set_timeout(self, seconds: int) -> None:
        self.timeout_s = seconds
        self.end_at = utc_now() + datetime.timedelta(seconds=seconds)


class SandboxTable:
    def __init__(self) -> None:
        self._sandboxes: dict[str, E2bSandbox] = {}

    def new_id(self) -> str:
        while True:
            sandbox_id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_CHARS))
            if sandbox_id not in self._sandboxes:
                return sandbox_id

    def add(self, sandbox: E2bSandbox) -> None:
        self._sandboxes[sandbox.sandbox_id] = sandbox

    def remove(self, sandbox_id: str) -> None:
        self._sandboxes.pop(sandbox_id, None)

    def of_tenant(self, sandbox_id: str, tenant: str) -> E2bSandbox | None:
        found = self._sandboxes.get(sandbox_id)
        return found if found is not None and found.tenant == tenant else None

    def with_token(self, sandbox_id: str, token: str | None) -> E2bSandbox | None:
        found = self._sandboxes.get(sandbox_id)
        expected = found.access_token if found is not None else "-" * 43
        matches = hmac.compare_digest(expected.encode(), (token or "").encode())
        return found if found is not None and matches else None

    def listed(self, tenant: str) -> list[E2bSandbox]:
        return [s for s in self._sandboxes.values() if s.tenant == tenant]

    def expired(self, now: datetime.datetime) -> list[E2bSandbox]:
        """Running sandboxes past their end: a paused one's clock is stopped, as in E2B (its
        resume gives it a new lifetime)."""
        return [s for s in self._sandboxes.values() if s.state == "running" and s.end_at <= now]

    def __len__(self) -> int:
        return len(self._sandboxes)
