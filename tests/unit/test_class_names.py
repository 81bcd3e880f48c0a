"""Every public class name of the host side is defined once, so a name in a traceback, a log line
or an import says which class it is. The in-container worker is a program of its own and keeps
its own names (its ``sandhold.ImportBlockedError`` is what user code sees, on purpose)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


def _public_classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "worker":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(relative))
    return found


def test_no_public_class_name_is_defined_twice_outside_the_worker() -> None:
    classes = _public_classes()
    assert len(classes) > 100  # the walk saw the package
    assert {name: where for name, where in classes.items() if len(where) > 1} == {}
