"""Prometheus metrics of one orchestrator, in a registry of its own: several orchestrators in one
process (tests, an embedding application) never share or collide on a counter.

Two kinds. Counters and the call histogram move where the event happens: ``Orchestrator.call``
(every interface passes there), the warm pool's take, the reconciler, ``end_session`` and the
HTTP key check. Gauges are computed at scrape time from the manager's own state (the session
table, the pools), so nothing is kept in step by hand.

No container CPU or memory: the engine's stats take about a second per container (Docker 20.10
answers even a one-shot request at its collector's next tick) and each holds one of the engine
client's threads, which the sessions' own calls need; ``sandhold ps`` shows memory on demand.

Label values are bounded whatever callers or containers send: a tool or operation outside the
contract counts as ``unknown``; an outcome is ``ok``, ``failed`` (the work failed: the user's
exception), ``cancelled`` or one of our error types; ending and reaping reasons are fixed kinds;
tenants are the server's own and policies those it loaded by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.errors import ERROR_TYPES

__all__ = [
    "CALL_BUCKETS",
    "CONTENT_TYPE",
    "Metrics",
    "call_outcome_label",
    "ending_kind",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# From a cached read (~1 ms) to a long cell or a terminal wait (the longest timeouts are minutes).
CALL_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
UNKNOWN: Final = "unknown"
# The quotas a refusal names: the tenant's, the orchestrator's, a policy's and the HTTP streams.
QUOTA_NAMES: Final = frozenset(
    {
        "sessions", "memory_mb", "cpus", "terminals_per_session", "processes_per_session",
        "max_sessions", "max_sessions_per_owner", "streams",
    }
)  # fmt: skip

# The rules an egress proxy refuses with (docs/egress.md); a proxy is untrusted, so any other
# rule it reports counts as ``unknown``.
EGRESS_RULES: Final = frozenset(
    {
        "allowlist", "private_address", "dns", "sni_mismatch", "sni_missing", "not_tls",
        "tls_unparsed", "auth", "limit.connections", "limit.bytes", "bad_request",
        "tenant.egress_mb",
    }
)  # fmt: skip

# Why sessions end, by the start of the reason ``end_session`` is given; the first match wins.
_ENDING_KINDS: Final = (
    ("destroyed", "destroyed"),
    ("idle", "idle"),
    ("maximum lifetime", "lifetime"),
    ("evicted", "evicted"),
    ("its container stopped", "container_stopped"),
    ("its owner", "owner_closed"),
    ("the orchestrator shut down", "shutdown"),
)


def ending_kind(reason: str) -> str:
    """The fixed kind of an ending reason (reasons carry ids and figures; labels may not)."""
    for prefix, kind in _ENDING_KINDS:
        if reason.startswith(prefix):
            return kind
    return "other"


def call_outcome_label(structured: Mapping[str, object] | None) -> str:
    """``ok``, ``cancelled`` (no answer), one of our error types, or ``failed`` for any other
    failure (the user's exception: its class name is the worker's word, not a label)."""
    if structured is None:
        return "cancelled"
    if structured.get("success"):
        return "ok"
    error_type = structured.get("error_type")
    return error_type if isinstance(error_type, str) and error_type in ERROR_TYPES else "failed"


@dataclass(frozen=True)
class SessionView:
    """What the session gauges read of one live session."""

    state: str
    tenant: str
    policy: str


class Metrics:
    """The counters, the histogram and the scrape-time gauges of one orchestrator."""

    def __init__(
        self,
        *,
        sessions: Callable[[], Iterable[SessionView]],
        pools: Callable[[], Mapping[str, Mapping[str, int]]],
        operations: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self._operations = {tool: frozenset(ops) for tool, ops in (operations or {}).items()}
        self.calls = Counter(
            "sandhold_calls",
            "Tool calls by tool, operation and outcome.",
            ["tool", "operation", "outcome"],
            registry=self.registry,
        )
        self.call_seconds = Histogram(
            "sandhold_call_duration_seconds",
            "Time from a call's arrival at Orchestrator.call to its answer.",
            ["tool", "operation"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self.pool_takes = Counter(
            "sandhold_pool_takes",
            "Creations of a pooled policy: a warm session taken (hit) or none ready (miss).",
            ["policy", "result"],
            registry=self.registry,
        )
        self.sessions_ended = Counter(
            "sandhold_sessions_ended",
            "Sessions ended, by kind of reason.",
            ["reason"],
            registry=self.registry,
        )
        self.reaped = Counter(
            "sandhold_containers_reaped",
            "Containers removed by a reconcile with no session of ours behind them, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.readopted = Counter(
            "sandhold_sessions_readopted",
            "Sessions of the registry re-adopted at start.",
            registry=self.registry,
        )
        self.quota_refusals = Counter(
            "sandhold_quota_refusals",
            "Requests refused for a quota, by tenant and quota.",
            ["tenant", "quota"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "sandhold_auth_failures",
            "HTTP requests refused for a wrong or missing API key (rate_limited: past the "
            "address's budget).",
            ["reason"],
            registry=self.registry,
        )
        self.http_refusals = Counter(
            "sandhold_http_refusals",
            "REST requests refused before any tool ran (a body too large or not JSON, an "
            "unknown route), by status.",
            ["status"],
            registry=self.registry,
        )
        self.egress_bytes = Counter(
            "sandhold_egress_bytes",
            "Bytes through the sessions' egress proxies, by tenant and direction (sent: from "
            "the session), as read from the proxies at each reaper round and at a session's end.",
            ["tenant", "direction"],
            registry=self.registry,
        )
        self.egress_refused = Counter(
            "sandhold_egress_refused",
            "Egress attempts the sessions' proxies refused, by tenant and rule.",
            ["tenant", "rule"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self, sessions, pools))
        # Children by label values: ``labels()`` takes a lock and builds a tuple each time.
        self._call_children: dict[tuple[str, str, str], Callable[[], None]] = {}
        self._duration_children: dict[tuple[str, str], Callable[[float], None]] = {}

    def name_operations(self, operations: Mapping[str, Iterable[str]]) -> None:
        """The tools and operations calls are counted by (the core knows no tool: ``Orchestrator``
        names them); any other counts as ``unknown``."""
        self._operations = {tool: frozenset(ops) for tool, ops in operations.items()}

    def call_labels(self, tool: object, operation: object) -> tuple[str, str]:
        """The tool and operation as label values: their names, or ``unknown``."""
        tool_label = tool if isinstance(tool, str) and tool in self._operations else UNKNOWN
        ops = self._operations.get(tool_label, frozenset())
        return tool_label, operation if isinstance(operation, str) and operation in ops else UNKNOWN

    def record_call(self, tool: object, operation: object, outcome: str, seconds: float) -> None:
        """One call: counted by outcome, its duration observed. Cheap: two dict looks-ups and
        two increments once a label combination has been seen."""
        key = (*self.call_labels(tool, operation), outcome)
        count = self._call_children.get(key)
        if count is None:
            count = self._call_children[key] = self.calls.labels(*key).inc
        count()
        observe = self._duration_children.get(key[:2])
        if observe is None:
            observe = self._duration_children[key[:2]] = self.call_seconds.labels(*key[:2]).observe
        observe(seconds)

    def refused_for_quota(self, tenant: str, quota: object) -> None:
        name = quota if isinstance(quota, str) and quota in QUOTA_NAMES else UNKNOWN
        self.quota_refusals.labels(tenant, name).inc()

    def record_egress(
        self, tenant: str, sent: int, received: int, refused: Mapping[str, int]
    ) -> None:
        """What one read of a session's proxy added: bytes each way and refusals by rule."""
        if sent:
            self.egress_bytes.labels(tenant, "sent").inc(sent)
        if received:
            self.egress_bytes.labels(tenant, "received").inc(received)
        for rule, count in refused.items():
            name = rule if rule in EGRESS_RULES else UNKNOWN
            self.egress_refused.labels(tenant, name).inc(count)

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """The gauges read at scrape time: sessions and pools."""

    def __init__(
        self,
        metrics: Metrics,
        sessions: Callable[[], Iterable[SessionView]],
        pools: Callable[[], Mapping[str, Mapping[str, int]]],
    ) -> None:
        self._metrics = metrics
        self._sessions = sessions
        self._pools = pools

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape time; nothing to check against at registration

    def collect(self) -> Iterator[Metric]:
        counts: dict[tuple[str, str, str], int] = {}
        for view in self._sessions():
            key = (view.state, view.tenant, view.policy)
            counts[key] = counts.get(key, 0) + 1
        sessions = GaugeMetricFamily(
            "sandhold_sessions",
            "Live sessions by state (idle, busy, paused), tenant and policy.",
            labels=["state", "tenant", "policy"],
        )
        for key, count in sorted(counts.items()):
            sessions.add_metric(list(key), count)
        yield sessions
        size = GaugeMetricFamily(
            "sandhold_pool_size", "Warm sessions a pool keeps, by policy.", labels=["policy"]
        )
        ready = GaugeMetricFamily(
            "sandhold_pool_ready", "Warm sessions ready now, by policy.", labels=["policy"]
        )
        for name, status in sorted(self._pools().items()):
            size.add_metric([name], status["size"])
            ready.add_metric([name], status["ready"])
        yield size
        yield ready
