"""The connections ``sandhold serve`` holds, and which of them must go (pure: the clock is given).

Invariants:
- A connection is counted from the moment it is accepted until it is released or evicted
  (whichever comes first; both are idempotent), against the server's capacity and its client
  address's share.
- Between requests a connection is *idle*, and has a deadline: ``keep_alive_timeout`` after it
  became idle while no byte of a next request came, ``header_timeout`` once one did (so a
  request head trickled byte by byte is cut like a silent connection, only later). A
  connection inside a request (a stream included) has none: streams are bounded per tenant.
- At capacity, a new connection takes the place of the idle one that has been idle longest;
  when none is idle the server stops accepting until one is released (the kernel's backlog
  holds the rest). Running out of descriptors lowers the capacity to what the process held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections import Counter
from collections.abc import Callable
from typing import Final

from orchestrator.http._limits import HttpLimitsConfig

# Descriptors left to the orchestrator (engine API sockets, attached streams, the registry)
# when running out of them has shown how many the connections may have.
DESCRIPTOR_HEADROOM: Final = 64


class Room(enum.Enum):
    """What making room for one more connection took."""

    FREE = "free"
    MADE = "made"  # an idle connection was evicted: its descriptor is freed on the next turn
    NONE = "none"  # every connection is in a request


class Refusal(enum.Enum):
    """Why a connection was not admitted."""

    CLIENT_SHARE = "too many connections from this address"


@dataclasses.dataclass(eq=False)
class Connection:
    """One accepted connection, as the limits see it."""

    client: str
    idle_since: float
    busy: bool = False
    partial: bool = False  # bytes of a next request arrived while idle
    transport: asyncio.BaseTransport | None = None

    def idle_deadline(self, limits: HttpLimitsConfig) -> float:
        """When this connection goes if it stays idle (meaningless while busy)."""
        timeout = limits.header_timeout if self.partial else limits.keep_alive_timeout
        return self.idle_since + timeout

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class ConnectionTable:
    """Every open connection; the idle ones also in the order they became idle."""

    def __init__(self, limits: HttpLimitsConfig, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.capacity = limits.max_connections
        self.clock = clock
        self._open: set[Connection] = set()
        # Ordered sets: insertion order is idle_since order, so the first is the longest idle.
        self._idle: dict[Connection, None] = {}
        self._per_client: Counter[str] = Counter()
        self.on_release: Callable[[], None] = lambda: None
        self.evicted = 0  # idle ones closed to make room, or at their deadline
        self.refused = 0  # refused for their address's share
        self.accepted = 0

    def __len__(self) -> int:
        return len(self._open)

    def make_room(self) -> Room:
        """Whether one more connection fits, after evicting the longest idle one if need be."""
        if len(self._open) < self.capacity:
            return Room.FREE
        victim = next(iter(self._idle), None)
        if victim is None:
            return Room.NONE
        self.evict(victim)
        return Room.MADE

    def over_share(self, client: str) -> bool:
        """Whether ``client`` holds its share already (a refusal, counted as one)."""
        over = self._per_client[client] >= self.limits.max_connections_per_client
        self.refused += over
        return over

    def admit(self, client: str) -> Connection | Refusal:
        if self.over_share(client):
            return Refusal.CLIENT_SHARE
        connection = Connection(client=client, idle_since=self.clock())
        self.accepted += 1
        self._open.add(connection)
        self._per_client[client] += 1
        return connection

    def attach(self, connection: Connection, transport: asyncio.BaseTransport) -> None:
        """The connection's transport exists: from now on it can be closed, so evicted."""
        connection.transport = transport
        if connection in self._open:
            self._idle[connection] = None
        else:  # evicted before it was attached
            connection.close()

    def release(self, connection: Connection) -> None:
        if connection not in self._open:
            return
        self._open.discard(connection)
        self._idle.pop(connection, None)
        self._per_client[connection.client] -= 1
        if not self._per_client[connection.client]:
            del self._per_client[connection.client]
        self.on_release()

    def evict(self, connection: Connection) -> None:
        self.evicted += 1
        connection.close()
        self.release(connection)

    def note(self, connection: Connection, *, busy: bool) -> None:
        """The connection went into a request, or came out of one."""
        if busy == connection.busy or connection not in self._open:
            return
        connection.busy = busy
        if busy:
            self._idle.pop(connection, None)
        else:
            connection.idle_since, connection.partial = self.clock(), False
            self._idle[connection] = None

    def expire(self) -> int:
        """Evict every idle connection past its deadline; how many went."""
        now = self.clock()
        expired = [c for c in self._idle if c.idle_deadline(self.limits) <= now]
        for connection in expired:
            self.evict(connection)
        return len(expired)

    def shrink(self) -> None:
        """Descriptors ran out: hold no more connections than now, less the headroom."""
        self.capacity = max(1, min(self.capacity, len(self._open) - DESCRIPTOR_HEADROOM))
        while len(self._open) > self.capacity and self._idle:
            self.evict(next(iter(self._idle)))

    def idle(self) -> list[Connection]:
        """The idle connections, longest idle first."""
        return list(self._idle)

    def statistics(self) -> dict[str, int]:
        return {
            "open": len(self._open),
            "idle": len(self._idle),
            "capacity": self.capacity,
            "accepted": self.accepted,
            "evicted": self.evicted,
            "refused": self.refused,
        }
