"""The limits of ``sandhold serve``'s HTTP server (``HttpLimitsConfig``) and the token buckets some
of them are kept with (``Budgets``).

Nothing here trusts a client to go away: every connection has a deadline while it is not in a
request, every client address a share of the connections, every tenant a number of held-open
streams, and a wrong key a price. Refusals answer 429 with an ``error_type``, never a traceback.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

from orchestrator.errors import InvalidArgumentError

# A request head is a few hundred bytes that any client sends at once; 10 s covers a slow link
# and still ends a slowloris client (one header byte every few seconds) quickly.
HEADER_TIMEOUT: Final = 10.0
# An idle kept-alive connection is closed after this long: uvicorn's default, and shorter than
# any client pool keeps one without using it (httpx: 5 s), so a reused one is rarely cut.
KEEP_ALIVE_TIMEOUT: Final = 5.0
# Connections held at once. Each costs a descriptor and some 10-20 KiB; 1024 is far above what
# the sessions of one host can serve and far below the descriptors a server is given.
MAX_CONNECTIONS: Final = 1024
# One address's share: a client pool opens tens at most (httpx: 100 with its default limits),
# and one address can then never hold more than an eighth of the server.
MAX_CONNECTIONS_PER_CLIENT: Final = 128
# Wrong keys one address may present per minute (a burst of as many, refilled evenly) before
# they are answered 429 without being logged or audited one by one. Keys are 256-bit random,
# so this is about what a flood costs the server, not about guessing.
AUTH_FAILURES_PER_MINUTE: Final = 20
# Held-open streams (terminal events, GET /mcp, E2B's command streams and /execute) of one
# tenant, every port's together: each holds a connection and a task for up to ten minutes; a
# few dozen cover every terminal a person or agent watches.
MAX_STREAMS_PER_TENANT: Final = 32
# Client addresses remembered at once for their budgets; the least recently seen is forgotten
# first, which can only hand a forgotten address a full budget again.
MAX_TRACKED_CLIENTS: Final = 10_000

K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HttpLimitsConfig:
    """What one ``sandhold serve`` holds for its clients; durations in seconds."""

    header_timeout: float = HEADER_TIMEOUT
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    auth_failures_per_minute: int = AUTH_FAILURES_PER_MINUTE
    max_streams_per_tenant: int = MAX_STREAMS_PER_TENANT

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise InvalidArgumentError(f"{field.name} must be positive, not {value!r}")
        if self.max_connections_per_client > self.max_connections:
            raise InvalidArgumentError("max_connections_per_client is over max_connections")


class Budgets(Generic[K]):
    """A token bucket per key: at most ``capacity`` spent at once, refilled at ``per_second``.
    Keys past ``max_keys`` are forgotten least recently used first."""

    def __init__(
        self,
        capacity: float,
        per_second: float,
        *,
        max_keys: int = MAX_TRACKED_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.per_second = per_second
        self.max_keys = max_keys
        self._clock = clock
        # key -> (tokens, when they were counted)
        self._buckets: OrderedDict[K, tuple[float, float]] = OrderedDict()

    def _tokens(self, key: K, now: float) -> float:
        tokens, counted = self._buckets.get(key, (self.capacity, now))
        return min(self.capacity, tokens + (now - counted) * self.per_second)

    def spend(self, key: K) -> bool:
        """Take one token for ``key``; False (and nothing taken) when it has none left."""
        now = self._clock()
        tokens = self._tokens(key, now)
        spent = tokens >= 1
        self._buckets[key] = (tokens - 1 if spent else tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return spent

    def retry_after(self, key: K) -> float:
        """Seconds until ``key`` has a token again (0 if it has one)."""
        missing = 1 - self._tokens(key, self._clock())
        return max(0.0, missing / self.per_second)
