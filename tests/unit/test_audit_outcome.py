"""A call record keeps what the host observed apart from what the sandbox claimed."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.audit.records import call_outcome
from orchestrator.errors import ERROR_TYPES
from orchestrator.session.repl.protocol import ExecuteReply, ProtocolViolation, Reply, payload

CELL = {"execution_time_ms": 1.5, "cpu_time_ms": 1.0, "peak_memory_mb": 30.0, "truncated": False}


def execute(**fields: Any) -> dict[str, Any]:
    return {"operation": "execute", **CELL, **fields}


def test_a_cell_the_worker_reports_as_failed_is_a_completed_call_with_its_claim() -> None:
    answer = execute(success=False, error_type="validation")
    assert call_outcome("python_repl", answer, answered=True) == {
        "success": True,
        "error_type": None,
        "ran": True,
        "worker_claims": {"success": False, "error_type": "validation", **CELL},
    }


@pytest.mark.parametrize("error_type", ["timeout", "process_crashed", "internal"])
def test_an_outcome_only_the_host_gives_is_the_hosts(error_type: str) -> None:
    answer = execute(success=False, error_type=error_type)
    assert call_outcome("python_repl", answer, answered=True) == {
        "success": False,
        "error_type": error_type,
        "ran": True,
    }


@pytest.mark.parametrize("error_type", ["invalid_argument", "session_not_found", "quota_exceeded"])
def test_a_refused_call_did_not_run(error_type: str) -> None:
    answer = {"operation": "read", "success": False, "error_type": error_type}
    assert call_outcome("files", answer, answered=True) == {
        "success": False,
        "error_type": error_type,
        "ran": False,
    }


def test_a_cancelled_call_has_no_claims() -> None:
    answer = {"operation": "execute", "error_type": "cancelled"}
    fields = call_outcome("python_repl", answer, answered=False)
    assert fields == {"success": False, "error_type": "cancelled", "ran": True}


def test_a_terminal_exit_status_is_the_engines_and_a_shell_status_a_claim() -> None:
    waited = {"operation": "wait", "success": True, "state": "exited", "exit_code": 3}
    assert call_outcome("terminal", waited, answered=True)["exit_status"] == 3
    run = {"operation": "run", "success": True, "exit_code": 3}
    fields = call_outcome("terminal", run, answered=True)
    assert "exit_status" not in fields and fields["worker_claims"] == {"exit_code": 3}


@pytest.mark.parametrize("error_type", sorted(set(ERROR_TYPES) - {"validation", "import_blocked"}))
def test_a_worker_reply_naming_an_error_type_of_the_host_is_a_protocol_violation(
    error_type: str,
) -> None:
    reply = Reply(type="reply", id="r1", ok=True).model_copy(
        update={"raw": {**CELL, "success": False, "error_type": error_type}}
    )
    with pytest.raises(ProtocolViolation):
        payload(reply, ExecuteReply)
