"""A session: one container and everything that runs in it, owned by one tenant.

Invariant: work on the session's interpreter is serialised by ``lock``; a caller that cannot get
it within the busy timeout gets ``busy`` instead of interleaving with the call in progress. File
and process operations do not take the lock: process operations are short execs of their own,
file operations go to the session's file helper (which takes one request at a time and sends a
concurrent one to a short exec of its own, ``files.operations``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import anyio

from orchestrator.backend.base import Backend
from orchestrator.errors import BusyError, OrchestratorError
from orchestrator.policy.model import Policy
from orchestrator.session.files.operations import SessionFiles
from orchestrator.session.history import CodeHistory
from orchestrator.session.processes import SessionProcesses
from orchestrator.session.repl.contexts import ReplContexts
from orchestrator.session.repl.interpreter import Repl
from orchestrator.session.shell import PersistentShell
from orchestrator.session.terminal.terminals import SessionTerminals

__all__ = ["LifetimeEndAction", "Session", "new_session_id"]

log = logging.getLogger(__name__)

# What the end of a session's lifetime (``set_timeout``'s) does: end it, or pause it until resumed.
LifetimeEndAction = Literal["end", "pause"]

# 128 bits of randomness: ids are bearer-like, never guessable.
SESSION_ID_BYTES = 16


def new_session_id() -> str:
    return secrets.token_hex(SESSION_ID_BYTES)


@dataclass(eq=False, kw_only=True)
class Session:
    id: str
    tenant: str
    # The task scope that owns the session; None: the tenant itself.
    task: str | None = None
    policy: Policy
    container_id: str
    repl: Repl
    # The REPL contexts beside ``repl`` (the default one), made on request.
    contexts: ReplContexts
    files: SessionFiles
    processes: SessionProcesses
    terminals: SessionTerminals
    shell: PersistentShell
    history: CodeHistory
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # Guards pause/resume so two calls never thaw (or freeze) the container at once.
    state_lock: anyio.Lock = field(default_factory=anyio.Lock)
    paused: bool = False
    calls_in_progress: int = 0
    # The call holding the interpreter ("python_repl.execute") and when it took it (monotonic),
    # for the ``busy`` answer of a call that waited for it in vain.
    running: tuple[str, float] | None = None
    closed: bool = False
    # The env every process of the session gets, checked against its policy when the session
    # was made (``policy.env``); kept in memory and in the registry (for re-adoption), never
    # logged, and only its names go into the audit log.
    env: Mapping[str, str] = field(default_factory=dict)
    # Labels given at creation (``session create``), answered with the session: memory only.
    metadata: Mapping[str, str] = field(default_factory=dict)
    # When ``set_timeout`` said the session ends (monotonic); None: its policy's lifetime.
    ends_at: float | None = None
    # The timeout_s of the last ``set_timeout``: the lifetime a resume gives again to a session
    # that its end paused (E2B's auto-pause).
    lifetime_s: float | None = None
    # What ``ends_at`` does: "end" the session, or "pause" it (its deadline then cleared until
    # a call or a resume thaws it, which gives it ``lifetime_s`` again).
    lifetime_end_action: LifetimeEndAction = "end"
    # CPU seconds and when, at the session's last ``metrics``: the next one's rate is from it.
    cpu_sample: tuple[float, float] | None = None

    @classmethod
    def assemble(
        cls,
        backend: Backend,
        *,
        session_id: str,
        tenant: str,
        policy: Policy,
        container_id: str,
        adopt_pid: int | None = None,
        on_new_worker: Callable[[int], None] | None = None,
    ) -> Session:
        """A session object for a container that exists (new, or re-adopted after a restart);
        nothing runs in it yet."""
        return cls(
            id=session_id,
            tenant=tenant,
            policy=policy,
            container_id=container_id,
            repl=Repl(
                backend, container_id, policy, adopt_pid=adopt_pid, on_new_worker=on_new_worker
            ),
            contexts=ReplContexts(backend, container_id, policy),
            files=SessionFiles(backend, container_id, policy),
            processes=SessionProcesses(backend, container_id, policy),
            terminals=SessionTerminals(backend, container_id, policy),
            shell=PersistentShell(backend, container_id, policy),
            history=CodeHistory(policy.python.max_history),
        )

    async def set_env(self, env: Mapping[str, str]) -> None:
        """Give the session its env (once, before its first call; a pooled session gets it when
        it is taken): every shell, terminal and background process started from now on sees
        it, and so does the REPL worker, told at once (it runs already, pooled or not) and
        every worker after it."""
        self.env = dict(env)
        self.terminals.session_env = self.env
        self.processes.session_env = self.env
        self.shell.session_env = self.env
        await self.repl.set_env(self.env)
        await self.contexts.set_env(self.env)

    @property
    def busy(self) -> bool:
        """In a call, or with a call waiting for the interpreter: not idle, not evictable."""
        return self.calls_in_progress > 0 or self.lock.locked()

    def touch(self) -> None:
        self.last_active = time.monotonic()

    @asynccontextmanager
    async def turn(self, *, busy_timeout: float, call: str = "a call") -> AsyncIterator[None]:
        """Hold the session for ``call`` (``python_repl.execute``); ``busy``, naming the call in
        progress and how long it has run, if that call keeps it past ``busy_timeout``."""
        acquired = False
        with anyio.move_on_after(busy_timeout):
            await self.lock.acquire()
            acquired = True
        if not acquired:
            raise BusyError(self._busy_message(busy_timeout))
        self.calls_in_progress += 1
        self.running = (call, time.monotonic())
        try:
            self.touch()
            yield
        finally:
            self.running = None
            self.calls_in_progress -= 1
            self.touch()
            self.lock.release()

    def _busy_message(self, waited: float) -> str:
        if self.running is None:  # released just as the wait ended
            return f"session {self.id} is busy with another call (waited {waited:g} s)"
        call, since = self.running
        ran = time.monotonic() - since
        return (
            f"session {self.id} is busy: {call} has run for {ran:.1f} s (waited {waited:g} s); "
            "python_repl interrupt stops a running cell, keeping the session's state"
        )

    @property
    def idle_seconds(self) -> float:
        return time.monotonic() - self.last_active

    async def close_parts(self, *, keep_worker: bool = False) -> None:
        """Stop what runs in the session (terminals, shell, file helper, and the REPL worker
        unless ``keep_worker``, which leaves it for the next orchestrator to re-adopt). Each part
        is closed even when an earlier one failed."""
        with anyio.CancelScope(shield=True):
            self.closed = True
            for part in (self.terminals, self.shell, self.files, self.contexts, self.repl):
                try:
                    if part is self.repl and keep_worker:
                        await self.repl.detach()
                    else:
                        await part.aclose()
                except OrchestratorError as exc:
                    log.warning(
                        "session %s: closing %s failed: %s", self.id, type(part).__name__, exc
                    )

    async def aclose(self, backend: Backend) -> None:
        """Stop what runs in the session and remove its container. Shielded: the container is
        always removed, or the failure to remove it is raised."""
        with anyio.CancelScope(shield=True):
            # The removal kills every process in the container at once: the worker is only let
            # go of, not killed first (an exec of its own, ~70 ms of every destroy).
            await self.close_parts(keep_worker=True)
            await backend.remove_container(self.container_id)
