"""Which failures are failures of the call (MCP ``isError``, a REST status other than 200) and
which report what user code did: one rule for both interfaces (pure logic)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ERROR_TYPES
from orchestrator.http._app import STATUS_BY_ERROR_TYPE
from orchestrator.tools import CALL_FAILURES, ToolResult


def test_rest_answers_a_status_other_than_200_for_exactly_the_call_failures() -> None:
    # unauthenticated is answered by the HTTP layer before a tool runs.
    assert set(STATUS_BY_ERROR_TYPE) == CALL_FAILURES - {"unauthenticated"}
    assert CALL_FAILURES - {"unauthenticated"} <= set(ERROR_TYPES)


@pytest.mark.parametrize(
    "error_type",
    [
        "ZeroDivisionError",
        "timeout",
        "validation",
        "import_blocked",
        "process_crashed",
        "output_limit",
    ],
)
def test_what_user_code_did_is_not_a_tool_error(error_type: str) -> None:
    assert not ToolResult({"success": False, "error_type": error_type}, "").is_error


@pytest.mark.parametrize("error_type", [*sorted(CALL_FAILURES), None])
def test_a_failure_of_the_call_is_a_tool_error(error_type: str | None) -> None:
    assert ToolResult({"success": False, "error_type": error_type}, "").is_error


def test_a_success_is_never_a_tool_error() -> None:
    assert not ToolResult({"success": True}, "").is_error
