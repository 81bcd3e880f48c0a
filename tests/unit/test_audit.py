"""The audit log: a hash chain of JSON lines that ``verify`` (and ``sandhold audit verify``)
checks."""

from __future__ import annotations

import hashlib
import itertools
import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import orchestrator.audit._log as audit_module
from orchestrator.audit._log import (
    GENESIS_HASH,
    AuditConfig,
    AuditLog,
    VerifyReport,
    arguments_digest,
    open_audit_log,
    verify,
)
from orchestrator.errors import AuditLogError

ROOT = Path(__file__).resolve().parents[2]
SEGMENT_1 = "audit-000001.jsonl"
# Long enough for any single record here; a test that waits on the log fails instead of hanging.
WAIT = 10


def _call(index: int, **changes: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "tenant": "team-a",
        "task": "task-1",
        "tool": "python_repl",
        "operation": "execute",
        "session_id": "s" * 32,
        "arguments": {"operation": "execute", "code": f"secret_{index} = 'hunter2'"},
        "success": True,
        "error_type": None,
        "duration_ms": 1.5,
    }
    return call | changes


async def _append(directory: Path, count: int, config: AuditConfig | None = None) -> str:
    with anyio.fail_after(WAIT):
        async with open_audit_log(directory, config) as audit:
            for index in range(count):
                await audit.record(**_call(index))
            return audit.head[1]


def _make_log(directory: Path, count: int, config: AuditConfig | None = None) -> str:
    """A log of one segment record and ``count`` call records; its last hash."""
    return anyio.run(_append, directory, count, config)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _rehashed(record: dict[str, Any]) -> dict[str, Any]:
    """What a forger does: recompute the record's own hash after changing it."""
    body = {key: value for key, value in record.items() if key != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return {**body, "hash": hashlib.sha256(canonical.encode()).hexdigest()}


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def _places(report: VerifyReport) -> set[tuple[str, int, str]]:
    return {(p.segment, p.line, p.kind) for p in report.problems}


def test_a_fresh_log_verifies_with_its_head(tmp_path: Path) -> None:
    head = _make_log(tmp_path, 5)
    report = verify(tmp_path, expect_head=head)
    assert report.ok, report.problems
    assert (report.records, report.segments, report.last_seq, report.last_hash) == (6, 1, 5, head)


def test_the_first_record_chains_from_genesis_and_each_names_the_hash_before(
    tmp_path: Path,
) -> None:
    _make_log(tmp_path, 2)
    records = [json.loads(line) for line in _lines(tmp_path / SEGMENT_1)]
    assert records[0]["prev"] == GENESIS_HASH
    assert [r["seq"] for r in records] == [0, 1, 2]
    for before, after in itertools.pairwise(records):
        assert after["prev"] == before["hash"]
        assert _rehashed(after)["hash"] == after["hash"]


def test_an_edited_field_is_found_on_its_line(tmp_path: Path) -> None:
    _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    lines = _lines(segment)
    lines[2] = lines[2].replace('"success":true', '"success":false')
    segment.write_text("".join(lines))
    report = verify(tmp_path)
    assert _places(report) == {(SEGMENT_1, 3, "edited")}
    assert report.problems[0].seq == 2


def test_an_edit_with_a_recomputed_hash_breaks_the_link_of_the_next_line(tmp_path: Path) -> None:
    _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    lines = _lines(segment)
    lines[2] = _line(_rehashed(json.loads(lines[2]) | {"tenant": "team-b"}))
    segment.write_text("".join(lines))
    assert _places(verify(tmp_path)) == {(SEGMENT_1, 4, "chain")}


def test_a_removed_record_is_found_where_it_was(tmp_path: Path) -> None:
    _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    lines = _lines(segment)
    del lines[2]
    segment.write_text("".join(lines))
    report = verify(tmp_path)
    assert _places(report) == {(SEGMENT_1, 3, "sequence"), (SEGMENT_1, 3, "chain")}
    assert "1 record(s) missing" in next(p.detail for p in report.problems if p.kind == "sequence")


def test_a_swapped_pair_is_found_on_both_lines(tmp_path: Path) -> None:
    _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    lines = _lines(segment)
    lines[2], lines[3] = lines[3], lines[2]
    segment.write_text("".join(lines))
    places = _places(verify(tmp_path))
    assert {(SEGMENT_1, 3, "sequence"), (SEGMENT_1, 4, "sequence")} <= places
    assert {(SEGMENT_1, 3, "chain"), (SEGMENT_1, 4, "chain")} <= places


def test_an_inserted_forged_record_with_a_valid_own_hash_is_found(tmp_path: Path) -> None:
    _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    lines = _lines(segment)
    before = json.loads(lines[1])
    forged = _rehashed(before | {"seq": before["seq"] + 1, "prev": before["hash"], "tool": "x"})
    lines.insert(2, _line(forged))
    segment.write_text("".join(lines))
    report = verify(tmp_path)
    # The forgery links to the record before it; the record after it no longer links.
    assert {(SEGMENT_1, 4, "sequence"), (SEGMENT_1, 4, "chain")} <= _places(report)
    assert all(p.line >= 4 for p in report.problems)


def test_a_file_cut_mid_record_is_reported_as_a_torn_line(tmp_path: Path) -> None:
    _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    data = segment.read_bytes()
    cut = len("".join(_lines(segment)[:2])) + 40
    segment.write_bytes(data[:cut])
    report = verify(tmp_path)
    assert _places(report) == {(SEGMENT_1, 3, "torn_tail")}
    assert "40 bytes" in report.problems[0].detail


def test_records_cut_off_at_a_line_end_are_found_only_against_a_kept_head(tmp_path: Path) -> None:
    head = _make_log(tmp_path, 4)
    segment = tmp_path / SEGMENT_1
    segment.write_text("".join(_lines(segment)[:3]))
    assert verify(tmp_path).ok  # a hash chain alone cannot see a clean cut at its end
    report = verify(tmp_path, expect_head=head)
    assert _places(report) == {(SEGMENT_1, 3, "head")}


@pytest.mark.anyio
async def test_a_torn_last_line_starts_a_new_segment_that_names_it(tmp_path: Path) -> None:
    await _append(tmp_path, 3)
    segment = tmp_path / SEGMENT_1
    segment.write_bytes(segment.read_bytes() + b'{"v":1,"seq":4,"ti')  # a crash mid-write
    torn_bytes = segment.read_bytes()
    assert _places(verify(tmp_path)) == {(SEGMENT_1, 5, "torn_tail")}

    with anyio.fail_after(WAIT):
        async with open_audit_log(tmp_path) as audit:
            assert audit.torn_tail is not None
            assert (audit.torn_tail.line, audit.torn_tail.length) == (5, 18)
            await audit.record(**_call(9))
            head = audit.head

    assert segment.read_bytes() == torn_bytes  # never repaired
    first = json.loads(_lines(tmp_path / "audit-000002.jsonl")[0])
    assert (first["kind"], first["reason"], first["torn"]["segment"]) == (
        "segment",
        "torn_tail",
        SEGMENT_1,
    )
    report = verify(tmp_path, expect_head=head[1])
    assert report.ok, report.problems
    assert head[0] == report.last_seq == 5
    assert any("partial record of 18 bytes" in note for note in report.notes)


def test_a_segment_left_empty_by_a_crash_gets_its_first_record_on_reopen(tmp_path: Path) -> None:
    _make_log(tmp_path, 2)
    empty = tmp_path / "audit-000002.jsonl"
    empty.touch(mode=0o600)
    assert _places(verify(tmp_path)) == {(empty.name, 0, "segment")}
    head = _make_log(tmp_path, 1)
    report = verify(tmp_path, expect_head=head)
    assert report.ok, report.problems
    assert json.loads(_lines(empty)[0])["segment"] == 2


@pytest.mark.anyio
async def test_a_hundred_concurrent_records_keep_one_valid_chain(tmp_path: Path) -> None:
    config = AuditConfig(fsync_every=10)
    with anyio.fail_after(WAIT):
        async with open_audit_log(tmp_path, config) as audit:
            async with anyio.create_task_group() as group:
                for index in range(100):
                    group.start_soon(_record_one, audit, index)
            head = audit.head
    report = verify(tmp_path, expect_head=head[1])
    assert report.ok, report.problems
    assert report.records == 101
    calls = [json.loads(line) for line in _lines(tmp_path / SEGMENT_1)][1:]
    assert sorted(c["session_id"] for c in calls) == sorted(f"s{i}" for i in range(100))


async def _record_one(audit: AuditLog, index: int) -> None:
    await audit.record(**_call(index, session_id=f"s{index}"))


def test_reopening_continues_the_chain_in_the_same_segment(tmp_path: Path) -> None:
    first_head = _make_log(tmp_path, 2)
    _make_log(tmp_path, 2)
    records = [json.loads(line) for line in _lines(tmp_path / SEGMENT_1)]
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert records[3]["prev"] == first_head
    assert verify(tmp_path).ok
    assert sorted(p.name for p in tmp_path.glob("audit-*")) == [SEGMENT_1]


def test_rotation_makes_segments_that_verify_as_one_chain(tmp_path: Path) -> None:
    _make_log(tmp_path, 30, AuditConfig(max_segment_bytes=2048))
    segments = sorted(tmp_path.glob("audit-*.jsonl"))
    assert len(segments) > 3
    for before, after in itertools.pairwise(segments):
        last = json.loads(_lines(before)[-1])
        first = json.loads(_lines(after)[0])
        assert (first["kind"], first["reason"], first["prev"]) == (
            "segment",
            "rotate",
            last["hash"],
        )
        assert first["seq"] == last["seq"] + 1
        assert before.stat().st_size <= 2048
    report = verify(tmp_path)
    assert report.ok, report.problems
    assert (report.records, report.segments) == (30 + len(segments), len(segments))

    alone = verify(segments[2])
    assert alone.ok, alone.problems
    assert any("not checked" in note for note in alone.notes)

    segments[1].unlink()
    report = verify(tmp_path)
    assert {(segments[2].name, 1, "missing"), (segments[2].name, 1, "chain")} <= _places(report)


@pytest.mark.anyio
async def test_arguments_are_hashed_not_stored_unless_configured(tmp_path: Path) -> None:
    await _append(tmp_path / "plain", 1)
    text = (tmp_path / "plain" / SEGMENT_1).read_text()
    assert "hunter2" not in text
    assert json.loads(text.splitlines()[1])["args_sha256"] == arguments_digest(
        _call(0)["arguments"]
    )
    assert "arguments" not in json.loads(text.splitlines()[1])

    await _append(tmp_path / "clear", 1, AuditConfig(record_arguments=True))
    record = json.loads(_lines(tmp_path / "clear" / SEGMENT_1)[1])
    assert record["arguments"] == _call(0)["arguments"]
    assert verify(tmp_path / "clear").ok


@pytest.mark.anyio
async def test_env_values_are_never_kept_not_even_in_clear_mode(tmp_path: Path) -> None:
    secret = "s3cr3t-" + "x" * 8
    arguments = {
        "operation": "start",
        "command": "true",
        "env": {"API_TOKEN": secret},
        "session_env": [{"name": "DB_PASSWORD", "value": secret}, "odd"],
    }
    with anyio.fail_after(WAIT):
        async with open_audit_log(tmp_path, AuditConfig(record_arguments=True)) as audit:
            await audit.record(**_call(0, tool="terminal", arguments=arguments))
            await audit.record(**_call(1, arguments={"operation": "create", "env": secret}))
    text = (tmp_path / SEGMENT_1).read_text()
    assert secret not in text
    first, second = (json.loads(line) for line in text.splitlines()[1:])
    assert first["arguments"]["env"] == {"API_TOKEN": "***"}
    assert first["arguments"]["session_env"] == [{"name": "DB_PASSWORD", "value": "***"}, "***"]
    assert first["arguments"]["command"] == "true"
    assert second["arguments"]["env"] == "***"
    # The digest is of what is kept: a guess at the value cannot be checked against it.
    assert first["args_sha256"] == arguments_digest(arguments)
    assert arguments_digest(arguments) == arguments_digest(
        {**arguments, "env": {"API_TOKEN": "another"}}
    )
    assert verify(tmp_path).ok


def test_the_argument_hash_ignores_key_order_and_survives_odd_values() -> None:
    assert arguments_digest({"a": 1, "b": [2]}) == arguments_digest({"b": [2], "a": 1})
    assert len(arguments_digest({1: b"bytes", "k": object()})) == 64


def test_segments_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    _make_log(tmp_path / "log", 1)
    assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "log" / SEGMENT_1).stat().st_mode) == 0o600


@pytest.mark.anyio
async def test_a_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT):
        async with open_audit_log(tmp_path):
            with pytest.raises(AuditLogError):
                await AuditLog.open(tmp_path)


@pytest.mark.anyio
async def test_a_closed_log_refuses_records(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT):
        audit = await AuditLog.open(tmp_path)
        await audit.aclose()
        await audit.aclose()
        with pytest.raises(AuditLogError):
            await audit.record(**_call(0))


@pytest.mark.anyio
async def test_a_cancelled_caller_is_still_audited(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT):
        async with open_audit_log(tmp_path) as audit:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await audit.record(**_call(0, success=False, error_type="timeout"))
            assert audit.head[0] == 1
    assert verify(tmp_path).ok


@pytest.mark.anyio
async def test_each_record_says_its_outcome(tmp_path: Path) -> None:
    async with open_audit_log(tmp_path) as audit:
        await audit.record(**_call(0))
        await audit.record(**_call(1, success=False, error_type="timeout"))
        await audit.record(**_call(2, success=False, error_type="cancelled", outcome="cancelled"))
    lines = [json.loads(line) for line in _lines(tmp_path / SEGMENT_1)]
    outcomes = [r["outcome"] for r in lines if r["kind"] == "call"]
    assert outcomes == ["ok", "failed", "cancelled"]


@pytest.mark.anyio
async def test_a_record_the_log_cannot_take_in_time_is_refused_and_the_chain_stays_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_module, "RECORD_TIMEOUT", 0.2)
    async with open_audit_log(tmp_path) as audit:
        audit._lock.acquire()  # what a write stuck on a failing disk does to the ones after it
        try:
            with anyio.fail_after(WAIT), anyio.CancelScope() as cancelled:
                cancelled.cancel()  # a cancelled caller is bounded too
                with pytest.raises(AuditLogError):
                    await audit.record(**_call(0))
        finally:
            audit._lock.release()
        await audit.record(**_call(1))
    # The abandoned write lands whole once the lock is free, or finds the log closed.
    report = verify(tmp_path)
    assert report.ok and report.records in (3, 4), report


@pytest.mark.anyio
async def test_opening_a_log_whose_last_record_was_edited_is_refused(tmp_path: Path) -> None:
    await _append(tmp_path, 2)
    segment = tmp_path / SEGMENT_1
    segment.write_text(segment.read_text().replace('"team-a"', '"team-b"'))
    with anyio.fail_after(WAIT), pytest.raises(AuditLogError):
        await AuditLog.open(tmp_path)


def _sandhold_audit_verify(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "orchestrator.cli", "audit", "verify", str(path)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_cli_says_ok_with_count_and_hash_for_a_whole_log(tmp_path: Path) -> None:
    head = _make_log(tmp_path, 3)
    result = _sandhold_audit_verify(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 4 records" in result.stdout
    assert head in result.stdout


def test_the_cli_exits_1_naming_the_tampered_line(tmp_path: Path) -> None:
    _make_log(tmp_path, 3)
    segment = tmp_path / SEGMENT_1
    lines = _lines(segment)
    lines[2] = lines[2].replace('"tool":"python_repl"', '"tool":"terminal"')
    segment.write_text("".join(lines))
    for target in (tmp_path, segment):
        result = _sandhold_audit_verify(target)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"{SEGMENT_1} line 3 (seq 2): edited" in result.stdout
