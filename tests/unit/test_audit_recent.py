"""The audit log's window onto its last records (``audit.recent``), which the operations page
reads: the records as written (their seq and time), newest first, per tenant and task, without
arguments, each tenant's window its own."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from orchestrator.audit._log import open_audit_log
from orchestrator.audit.recent import MAX_TENANTS, SUMMARY_FIELDS, RecentRecords
from tests.unit.test_audit import SEGMENT_1, WAIT, _call

pytestmark = pytest.mark.anyio


async def test_the_window_holds_the_records_as_written_newest_first_without_arguments(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(WAIT):
        async with open_audit_log(tmp_path) as audit:
            for index in range(3):
                await audit.record(**_call(index, call_id=f"call-{index}"))
            latest = audit.recent.latest("team-a", limit=10)
    written = [json.loads(line) for line in (tmp_path / SEGMENT_1).read_text().splitlines()][1:]
    assert [event["seq"] for event in latest] == [r["seq"] for r in reversed(written)]
    assert [event["time"] for event in latest] == [r["time"] for r in reversed(written)]
    assert [event["call_id"] for event in latest] == ["call-2", "call-1", "call-0"]
    assert all(list(event) == list(SUMMARY_FIELDS) for event in latest)
    assert "hunter2" not in json.dumps(latest)


def test_another_tenants_flood_does_not_push_a_tenants_records_out() -> None:
    recent = RecentRecords(per_tenant=5)
    recent.add({"tenant": "quiet", "seq": 0, "tool": "python_repl", "outcome": "ok"})
    for seq in range(1, 100):
        recent.add({"tenant": "loud", "seq": seq, "tool": "python_repl", "outcome": "ok"})
    assert [e["seq"] for e in recent.latest("quiet", limit=10)] == [0]
    assert [e["seq"] for e in recent.latest("loud", limit=10)] == [99, 98, 97, 96, 95]
    assert recent.latest("nobody", limit=10) == []


def test_a_task_sees_its_own_records_and_the_limit_counts_those() -> None:
    recent = RecentRecords()
    for seq, task in enumerate(["a", "b", "a", None, "a"]):
        recent.add({"tenant": "t", "task": task, "seq": seq})
    assert [e["seq"] for e in recent.latest("t", task="a", limit=2)] == [4, 2]
    assert [e["seq"] for e in recent.latest("t", limit=2)] == [4, 3]


def test_the_tenant_written_to_least_recently_goes_first_past_the_bound() -> None:
    recent = RecentRecords()
    recent.add({"tenant": "first", "seq": 0})
    recent.add({"tenant": "kept", "seq": 1})
    for index in range(MAX_TENANTS - 2):
        recent.add({"tenant": f"t{index}", "seq": 2 + index})
    recent.add({"tenant": "kept", "seq": 10_000})  # written to again: the most recent now
    recent.add({"tenant": "one-more", "seq": 10_001})
    assert recent.latest("first", limit=1) == []
    assert [e["seq"] for e in recent.latest("kept", limit=5)] == [10_000, 1]
