"""The last records an audit log wrote, kept in memory per tenant, for the operations page.

Only what this process wrote since the log was opened: the records on disk are the log, this is
a window onto its end. Each tenant has its own window, so one tenant's flood of calls never
pushes another's records out of view; at most ``MAX_TENANTS`` tenants are kept (the one written
to least recently goes first). A record's summary leaves out its arguments (their digest too)
and anything a worker claimed: what a caller did, when, and how it ended.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_TENANTS", "RECENT_PER_TENANT", "SUMMARY_FIELDS", "RecentRecords"]

# What an operator reads on one screen, with room to scroll.
RECENT_PER_TENANT: Final = 200
# Tenants are the server's own (a tenants file's), but a library caller may name any.
MAX_TENANTS: Final = 256
SUMMARY_FIELDS: Final = (
    "seq",
    "time",
    "tenant",
    "task",
    "tool",
    "operation",
    "session_id",
    "outcome",
    "error_type",
    "duration_ms",
    "call_id",
)


class RecentRecords:
    """Summaries of the last call records, per tenant. The audit log's writing thread adds, the
    event loop reads: a lock of its own, held only to append or copy (never across a write to
    disk), so a reader never waits for a slow disk."""

    def __init__(self, per_tenant: int = RECENT_PER_TENANT) -> None:
        self._per_tenant = per_tenant
        self._by_tenant: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, record: Mapping[str, Any]) -> None:
        summary = {name: record.get(name) for name in SUMMARY_FIELDS}
        with self._lock:
            self._add(str(record.get("tenant")), summary)

    def _add(self, tenant: str, summary: dict[str, Any]) -> None:
        window = self._by_tenant.get(tenant)
        if window is None:
            window = self._by_tenant[tenant] = deque(maxlen=self._per_tenant)
            while len(self._by_tenant) > MAX_TENANTS:
                self._by_tenant.popitem(last=False)
        else:
            self._by_tenant.move_to_end(tenant)
        window.append(summary)

    def latest(self, tenant: str, *, task: str | None = None, limit: int) -> list[dict[str, Any]]:
        """The tenant's last ``limit`` records, newest first; with ``task``, that task's only."""
        with self._lock:
            window = list(self._by_tenant.get(tenant, ()))
        found = []
        for summary in reversed(window):
            if task is None or summary["task"] == task:
                found.append(dict(summary))
                if len(found) == limit:
                    break
        return found
