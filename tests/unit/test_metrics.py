"""The metrics' pure logic: a registry per orchestrator, bounded label values, gauges computed at
scrape time. Against a real ``sandhold serve``: tests/docker/test_serve_ops.py."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from orchestrator._core.metrics import (
    Metrics,
    SessionView,
    call_outcome_label,
    ending_kind,
)


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def make(sessions: list[SessionView] | None = None) -> Metrics:
    return Metrics(
        sessions=lambda: sessions or [],
        pools=lambda: {"default": {"size": 2, "ready": 1}},
        operations={"python_repl": ["execute", "destroy"]},
    )


def test_two_orchestrators_in_one_process_count_apart() -> None:
    first, second = make(), make()
    first.record_call("python_repl", "execute", "ok", 0.01)
    key = (
        "sandhold_calls_total",
        (("operation", "execute"), ("outcome", "ok"), ("tool", "python_repl")),
    )
    assert samples(first)[key] == 1.0
    assert key not in samples(second)


def test_tools_and_operations_outside_the_contract_count_as_unknown() -> None:
    metrics = make()
    metrics.record_call("no-such-tool\n", "execute", "invalid_argument", 0.001)
    metrics.record_call("python_repl", {"not": "a name"}, "invalid_argument", 0.001)
    found = samples(metrics)
    unknown_tool = (("operation", "unknown"), ("outcome", "invalid_argument"), ("tool", "unknown"))
    unknown_op = (
        ("operation", "unknown"),
        ("outcome", "invalid_argument"),
        ("tool", "python_repl"),
    )
    assert found[("sandhold_calls_total", unknown_tool)] == 1.0
    assert found[("sandhold_calls_total", unknown_op)] == 1.0


def test_the_histogram_counts_every_call_of_an_operation() -> None:
    metrics = make()
    for seconds in (0.002, 0.2, 20.0):
        metrics.record_call("python_repl", "execute", "ok", seconds)
    metrics.record_call("python_repl", "execute", "timeout", 30.0)
    found = samples(metrics)
    labels = (("operation", "execute"), ("tool", "python_repl"))
    assert found[("sandhold_call_duration_seconds_count", labels)] == 4.0
    assert found[("sandhold_call_duration_seconds_bucket", (("le", "0.25"), *labels))] == 2.0


def test_outcomes_are_ok_cancelled_our_error_types_or_failed() -> None:
    assert call_outcome_label({"success": True}) == "ok"
    assert call_outcome_label(None) == "cancelled"
    assert call_outcome_label({"success": False, "error_type": "timeout"}) == "timeout"
    # A user's exception class, or anything a container makes up, is no label value.
    assert call_outcome_label({"success": False, "error_type": "ZeroDivisionError"}) == "failed"
    assert call_outcome_label({"success": False, "error_type": ["x"]}) == "failed"


def test_ending_reasons_become_fixed_kinds() -> None:
    assert ending_kind("destroyed by its owner") == "destroyed"
    assert ending_kind("idle for 300 s") == "idle"
    assert ending_kind("maximum lifetime (3600 s) reached") == "lifetime"
    assert ending_kind("evicted: the orchestrator is at max_sessions") == "evicted"
    assert ending_kind("its container stopped or disappeared") == "container_stopped"
    assert ending_kind("its owner task t-1 was closed") == "owner_closed"
    assert ending_kind("the orchestrator shut down") == "shutdown"
    assert ending_kind("something new") == "other"


def test_session_and_pool_gauges_are_read_at_scrape_time() -> None:
    live = [SessionView("idle", "local", "default"), SessionView("idle", "local", "default")]
    metrics = make(live)
    found = samples(metrics)
    key = (("policy", "default"), ("state", "idle"), ("tenant", "local"))
    assert found[("sandhold_sessions", key)] == 2.0
    assert found[("sandhold_pool_size", (("policy", "default"),))] == 2.0
    assert found[("sandhold_pool_ready", (("policy", "default"),))] == 1.0
    live.append(SessionView("paused", "local", "default"))
    paused = (("policy", "default"), ("state", "paused"), ("tenant", "local"))
    assert samples(metrics)[("sandhold_sessions", paused)] == 1.0


def test_quota_refusals_name_known_quotas_only() -> None:
    metrics = make()
    metrics.refused_for_quota("team-a", "sessions")
    metrics.refused_for_quota("team-a", "made-up")
    found = samples(metrics)
    assert found[("sandhold_quota_refusals_total", (("quota", "sessions"), ("tenant", "team-a")))]
    assert found[("sandhold_quota_refusals_total", (("quota", "unknown"), ("tenant", "team-a")))]


def test_egress_bytes_and_refusals_count_by_tenant_and_known_rule() -> None:
    metrics = make()
    metrics.record_egress("team-a", 100, 2000, {"tenant.egress_mb": 2, "made-up\n": 1})
    metrics.record_egress("team-a", 0, 500, {})
    found = samples(metrics)
    by = "sandhold_egress_bytes_total"
    assert found[(by, (("direction", "received"), ("tenant", "team-a")))] == 2500.0
    assert found[(by, (("direction", "sent"), ("tenant", "team-a")))] == 100.0
    refused = "sandhold_egress_refused_total"
    assert found[(refused, (("rule", "tenant.egress_mb"), ("tenant", "team-a")))] == 2.0
    assert found[(refused, (("rule", "unknown"), ("tenant", "team-a")))] == 1.0
