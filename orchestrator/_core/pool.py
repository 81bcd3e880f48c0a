"""A warm pool: sessions of one policy made ahead of demand (container started, worker ready), so
creating a session is taking one from a deque.

Invariants: a pooled session is handed out at most once and was never anyone's before; nothing
older than its policy's maximum lifetime (less a margin for the new owner) is handed out, nor
one of a policy other than the pool's (``use_policy`` retires what was made under the old one,
a session being built included); the pool refills in the background, one session at a time,
backing off while the engine fails; a size of zero drains it. With an ``idle_timeout``, a pool
nothing was taken from for that long (counted from the last take, or from when it was last
filled, so that a slow fill is not taken for idleness) drains to zero (a server nobody uses
holds no containers) and fills again at the next take.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from orchestrator.errors import OrchestratorError
from orchestrator.policy.model import Policy
from orchestrator.session.session import Session

log = logging.getLogger(__name__)

# A pooled session must leave its owner at least this share of the policy's lifetime.
MIN_REMAINING_LIFETIME_SHARE = 0.5
# While the engine refuses, retry after 1, 2, 4 ... seconds, at most this long.
MAX_BACKOFF = 30.0
# Even with nothing taken, look at the pool this often to retire sessions grown too old.
CHECK_INTERVAL = 60.0

Build = Callable[[Policy], Awaitable[Session]]
Discard = Callable[[Session, str], Awaitable[None]]


class WarmPool:
    def __init__(
        self,
        policy: Policy,
        size: int,
        *,
        build: Build,
        discard: Discard,
        idle_timeout: float | None = None,
    ) -> None:
        self.policy = policy
        self.size = size
        self.idle_timeout = idle_timeout
        # The last take, resize or fill: idleness is counted from here.
        self._active_at = time.monotonic()
        self._build = build
        self._discard = discard
        self._ready: deque[Session] = deque()
        self._stale: list[Session] = []
        self._wake = anyio.Event()

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def target(self) -> int:
        """How many sessions the pool keeps now: its size, or none once idle."""
        if self.idle_timeout is not None and self._idle_for() >= self.idle_timeout:
            return 0
        return self.size

    def _idle_for(self) -> float:
        return time.monotonic() - self._active_at

    def container_ids(self) -> set[str]:
        """Containers this pool holds, ready or on their way out."""
        return {s.container_id for s in (*self._ready, *self._stale)}

    def take_nowait(self) -> Session | None:
        """A ready session, or None when the pool is empty (the caller then builds one cold)."""
        self._active_at = time.monotonic()
        self._wake.set()
        while self._ready:
            session = self._ready.popleft()
            if self._fresh(session):
                return session
            self._stale.append(session)
        return None

    def use_policy(self, policy: Policy) -> None:
        """Fill with sessions of ``policy`` from now on; what is ready is retired."""
        self.policy = policy
        self._stale.extend(self._ready)
        self._ready.clear()
        self._wake.set()

    def resize(self, size: int) -> None:
        self.size = size
        self._active_at = time.monotonic()  # asked for now: not idle
        self._wake.set()

    def _fresh(self, session: Session) -> bool:
        lifetime = self.policy.timeouts.max_lifetime_s
        age = time.monotonic() - session.started
        return age <= lifetime * (1 - MIN_REMAINING_LIFETIME_SHARE)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the pool at its size until cancelled; then everything still pooled is removed."""
        task_status.started()
        try:
            backoff = 1.0
            while True:
                await self._retire()
                if len(self._ready) < self.target:
                    try:
                        policy = self.policy
                        session = await self._build(policy)
                        # Made under a policy replaced meanwhile: retired, never handed out.
                        (self._ready if policy is self.policy else self._stale).append(session)
                        if len(self._ready) >= self.size:
                            self._active_at = time.monotonic()  # full: idle from now
                        backoff = 1.0
                        continue
                    except OrchestratorError as exc:
                        log.warning("pool %s: could not warm a session: %s", self.policy.name, exc)
                        await anyio.sleep(backoff)
                        backoff = min(backoff * 2, MAX_BACKOFF)
                        continue
                self._wake = anyio.Event()
                with anyio.move_on_after(self._next_check()):
                    await self._wake.wait()
        finally:
            with anyio.CancelScope(shield=True):
                self._stale.extend(self._ready)
                self._ready.clear()
                await self._retire()

    def _next_check(self) -> float:
        """Seconds until the pool must look again: at most ``CHECK_INTERVAL``, sooner when it
        is to go idle before then (a little after, so that it then is)."""
        if self.idle_timeout is None or not self.target:
            return CHECK_INTERVAL
        return min(CHECK_INTERVAL, self.idle_timeout - self._idle_for() + 0.01)

    async def _retire(self) -> None:
        """Remove what is stale and what exceeds the size (a pool resized down, or to zero)."""
        self._stale.extend(s for s in self._ready if not self._fresh(s))
        kept = [s for s in self._ready if self._fresh(s)]
        target = self.target
        self._stale.extend(kept[target:])
        self._ready = deque(kept[:target])
        while self._stale:
            await self._discard(self._stale.pop(), "retired from the warm pool")
