"""A tenant's egress, counted from its sessions' proxies: what moved since the last read, per
session, summed per tenant over a window, and which sessions must be refused for the tenant's
``egress_mb``. Pure bookkeeping, no I/O: the manager reads the proxies and acts on the answers.

Rule (the simplest that lets a tenant work again): the bytes a tenant's sessions move through
their proxies (both directions) are summed over fixed windows of ``EGRESS_WINDOW_S`` from the
orchestrator's start. From the read that finds the sum at or over ``egress_mb`` MiB until the
window turns, the tenant's proxies refuse every new attempt and close open connections with rule
``tenant.egress_mb``. The count lives in this process: a restarted orchestrator starts a window
at zero (a re-adopted session's proxy totals count again from the start of that proxy).

Invariant: a proxy's totals only grow; totals below the last read are a proxy this meter has
not seen (a session id reused is impossible, but a container is untrusted), taken whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.backend.network_log import EgressCounters

__all__ = ["EGRESS_WINDOW_S", "QUOTA_RULE", "EgressDelta", "EgressMeter"]

# An hour: long enough that a quota means a budget, short enough that a tenant that hit it can
# go on the same working session.
EGRESS_WINDOW_S = 3600.0
QUOTA_RULE = "tenant.egress_mb"
MIB = 1024 * 1024


@dataclass(frozen=True)
class EgressDelta:
    """What one session's proxy moved and refused since the meter's last read of it."""

    bytes_sent: int = 0
    bytes_received: int = 0
    refused: dict[str, int] = field(default_factory=dict)


@dataclass
class EgressMeter:
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, EgressCounters] = field(default_factory=dict)
    _used: dict[str, int] = field(default_factory=dict)
    _window: int = 0
    _started: float | None = None

    def _roll(self) -> None:
        now = self.clock()
        if self._started is None:
            self._started = now
        window = int((now - self._started) // EGRESS_WINDOW_S)
        if window != self._window:
            self._window, self._used = window, {}

    def observe(self, session_id: str, tenant: str, counters: EgressCounters) -> EgressDelta:
        """Take a fresh read of a session's proxy totals; what it adds to the tenant's use."""
        self._roll()
        last = self._last.get(session_id, EgressCounters())
        grew = counters.bytes_sent >= last.bytes_sent and counters.bytes_received >= (
            last.bytes_received
        )
        if not grew:
            last = EgressCounters()
        refused = {
            rule: n - last.refused.get(rule, 0)
            for rule, n in counters.refused.items()
            if n > last.refused.get(rule, 0)
        }
        delta = EgressDelta(
            counters.bytes_sent - last.bytes_sent,
            counters.bytes_received - last.bytes_received,
            refused,
        )
        self._last[session_id] = counters
        moved = delta.bytes_sent + delta.bytes_received
        self._used[tenant] = self._used.get(tenant, 0) + moved
        return delta

    def forget(self, session_id: str) -> None:
        self._last.pop(session_id, None)

    def used(self, tenant: str) -> int:
        """Bytes the tenant's sessions moved in the current window."""
        self._roll()
        return self._used.get(tenant, 0)

    def over(self, tenant: str, egress_mb: int | None) -> bool:
        return egress_mb is not None and self.used(tenant) >= egress_mb * MIB
