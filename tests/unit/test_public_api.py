"""``import orchestrator`` is the public API: a sorted ``__all__`` whose every name resolves."""

from __future__ import annotations

import orchestrator
from orchestrator.errors import ERROR_TYPES


def _isort_key(name: str) -> tuple[bool, bool, str]:
    # Constants, then classes, then functions; each group in plain order (ruff's RUF022 style).
    return (not name.isupper(), not name[:1].isupper(), name)


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert orchestrator.__all__ == sorted(orchestrator.__all__, key=_isort_key)
    assert len(set(orchestrator.__all__)) == len(orchestrator.__all__)
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name) is not None, name


def test_the_public_api_offers_the_four_tools_and_both_orchestrators() -> None:
    assert {"files", "process", "python_repl", "terminal"} <= set(orchestrator.TOOLS)
    assert {"Orchestrator", "SyncOrchestrator", "OrchestratorConfig"} <= set(orchestrator.__all__)


def test_every_exported_error_has_a_stable_code() -> None:
    errors = [getattr(orchestrator, n) for n in orchestrator.__all__ if n.endswith("Error")]
    for error in errors:
        assert issubclass(error, orchestrator.OrchestratorError)
        assert error.code in ERROR_TYPES


def test_the_worker_reserves_exactly_the_stable_error_types() -> None:
    from orchestrator.worker.executor import RESERVED_ERROR_TYPES

    assert frozenset(ERROR_TYPES) == RESERVED_ERROR_TYPES
