"""The blocking facade drives the same orchestrator from code without an event loop."""

from __future__ import annotations

import pytest

from orchestrator import SyncOrchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = pytest.mark.docker


def test_the_sync_orchestrator_runs_the_scenario_and_cleans_up(
    worker_image: ImageBuildResult,
) -> None:
    with SyncOrchestrator(config(worker_image.tag)) as sandhold:
        first = sandhold.execute("x = 20\nx + 1")
        assert first.result_repr == "21"
        shell = sandhold.call(
            "terminal", {"operation": "run", "command": "echo hi", "session_id": first.session_id}
        )
        assert shell.structured["stdout"] == "hi\n"
        wrong = sandhold.call("python_repl", {"operation": "execute"})
        assert wrong.structured["error_type"] == "invalid_argument"
        assert len(sandhold.list_sessions()) == 1
        assert sandhold.destroy(first.session_id) is True
        second = sandhold.execute("1")
    assert second.success
    with pytest.raises(RuntimeError, match="context manager"):
        sandhold.execute("1")
