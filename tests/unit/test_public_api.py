"""``import orchestrator`` is the public API: a sorted ``__all__`` whose every name resolves; and
the error tree is whole: every error of ours is in ``errors.py``, drawn there, raised somewhere
and exported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import orchestrator
from orchestrator import errors
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


PACKAGE = Path(orchestrator.__file__).parent
# Raised and handled inside sandhold only: the HTTP front answers it as 413, callers turn a
# missing container into ``session_not_found`` for its session, and ``serve --config`` is the
# command line's.
NOT_EXPORTED = {
    "BodyTooLargeError",
    "ConfigFileError",
    "ContainerNotFoundError",
    "UnsupportedEncodingError",
}


def _host_modules() -> list[Path]:
    """The host side; the in-container worker is a program of its own with errors of its own."""
    return [
        p for p in sorted(PACKAGE.rglob("*.py")) if "worker" not in p.relative_to(PACKAGE).parts
    ]


def _error_classes() -> list[type[errors.OrchestratorError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.OrchestratorError)
    ]


def test_every_orchestrator_error_lives_in_errors_and_is_drawn_in_its_tree() -> None:
    defined_elsewhere = []
    for path in _host_modules():
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(base, ast.Name) and base.id in errors.__all__ for base in node.bases
            ):
                defined_elsewhere.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert defined_elsewhere == []
    tree = errors.__doc__ or ""
    for error in _error_classes():
        assert error.__name__ in errors.__all__
        assert re.search(rf"─ {error.__name__} +{error.code}\b", tree) or (
            error is errors.OrchestratorError
        ), error.__name__


def test_every_error_users_may_catch_is_exported() -> None:
    exported = {error.__name__ for error in _error_classes()} - NOT_EXPORTED
    assert exported <= set(orchestrator.__all__)


def test_every_leaf_error_is_raised_somewhere() -> None:
    used = set()
    for path in _host_modules():
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                used.add(node.func.id)
            elif isinstance(node, ast.Name) and node.id == "ContainerNotFoundError":
                used.add(node.id)  # raised under its backend alias, NotFoundError
    bases = {base for error in _error_classes() for base in error.__bases__}
    leaves = {error.__name__ for error in _error_classes() if error not in bases}
    assert leaves - used == set()
