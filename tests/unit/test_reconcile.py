"""Reconcile planning: a live container the registry knows is re-adopted, a row without its
container is forgotten, a stopped or mislabelled container is forgotten and reaped, and a container
the registry does not know is reaped."""

from __future__ import annotations

import pytest

from orchestrator.backend.base import LABEL_ORCHESTRATOR, LABEL_SESSION, ContainerSummary
from orchestrator.registry.reconcile import ReconcileReport, plan
from orchestrator.registry.store import SessionRecord


def record(session_id: str) -> SessionRecord:
    return SessionRecord(
        id=session_id,
        tenant="team-a",
        task=None,
        policy_json="{}",
        container_id=f"c-{session_id}",
        worker_pid=7,
        created_at="2024-05-01T12:00:00+00:00",
    )


def container(
    session_id: str, state: str = "running", *, label: str | None = None
) -> ContainerSummary:
    labels = {LABEL_ORCHESTRATOR: "orch-1", LABEL_SESSION: label or session_id}
    return ContainerSummary(id=f"c-{session_id}", labels=labels, state=state, created=0.0)


@pytest.mark.parametrize("state", ["running", "paused"])
def test_a_live_container_of_a_known_session_is_adopted(state: str) -> None:
    rec, box = record("s1"), container("s1", state)
    result = plan([rec], [box])
    assert result.adopt == [(rec, box)]
    assert result.reap == [] and result.forget == []


def test_a_session_whose_container_is_gone_is_forgotten() -> None:
    rec = record("s1")
    result = plan([rec], [])
    assert result.forget == [rec]
    assert result.adopt == [] and result.reap == []


@pytest.mark.parametrize("state", ["exited", "created", "dead", "restarting", "removing"])
def test_a_stopped_container_is_reaped_and_its_session_forgotten(state: str) -> None:
    rec, box = record("s1"), container("s1", state)
    result = plan([rec], [box])
    assert result.adopt == []
    assert result.forget == [rec]
    assert result.reap == [box]


def test_a_container_the_registry_does_not_know_is_reaped() -> None:
    box = container("stranger")
    result = plan([], [box])
    assert result.reap == [box]
    assert result.adopt == [] and result.forget == []


def test_a_container_labelled_for_another_session_is_not_adopted() -> None:
    rec = record("s1")
    box = container("s1", label="s-other")
    result = plan([rec], [box])
    assert result.adopt == []
    assert result.forget == [rec]
    assert result.reap == [box]


def test_a_container_without_a_session_label_is_not_adopted() -> None:
    rec = record("s1")
    box = ContainerSummary(id="c-s1", labels={}, state="running", created=0.0)
    result = plan([rec], [box])
    assert result.adopt == [] and result.forget == [rec] and result.reap == [box]


def test_a_mixed_set_is_split_into_adopt_reap_and_forget() -> None:
    live, paused, gone, stopped = (record(s) for s in ("live", "paused", "gone", "stopped"))
    boxes = [
        container("live"),
        container("paused", "paused"),
        container("stopped", "exited"),
        container("stranger"),
    ]
    result = plan([live, paused, gone, stopped], boxes)
    assert [r.id for r, _ in result.adopt] == ["live", "paused"]
    assert all(r.container_id == c.id for r, c in result.adopt)
    assert sorted(r.id for r in result.forget) == ["gone", "stopped"]
    assert sorted(c.id for c in result.reap) == ["c-stopped", "c-stranger"]


def test_plan_accepts_one_shot_iterables() -> None:
    rec, box = record("s1"), container("s1")
    result = plan(iter([rec]), iter([box]))
    assert result.adopt == [(rec, box)]


def test_the_report_summary_counts_each_outcome() -> None:
    report = ReconcileReport(adopted=["s1", "s2"], reaped=["c9"], forgotten=[])
    summary = report.summary()
    assert summary.startswith("re-adopted 2 session(s), reaped 1 container(s), forgot 0 session(s)")
    assert ReconcileReport().summary().startswith("re-adopted 0 session(s), reaped 0 container(s)")
