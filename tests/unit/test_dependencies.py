"""The host package declares what it imports, and imports nothing it does not declare: a fresh
``pip install`` of sandhold is enough to run it (psutil, for one, is only the worker's, in the
image)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# A subpackage that serves an optional extra may import that extra's dependencies too; nothing
# outside it imports them (serve loads orchestrator.http.e2b only for --e2b-port).
EXTRA_PACKAGES = {"http/e2b": "e2b", "backend/kubernetes": "kubernetes"}


def _declared(extra: str | None = None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    if extra is not None:
        deps += project["optional-dependencies"][extra]
    return {_normal(re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0]) for dep in deps}


def _third_party_imports(subpackage: str | None = None) -> set[str]:
    """Of the whole package (less the worker and the extras' subpackages), or of one of those."""
    found: set[str] = set()
    root = PACKAGE / subpackage if subpackage else PACKAGE
    for path in root.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if "worker" in parts:
            continue  # runs inside the sandbox, stdlib only
        if subpackage is None and any(
            "/".join(parts).startswith(f"{extra}/") for extra in EXTRA_PACKAGES
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "orchestrator"}


@pytest.mark.parametrize("subpackage", [None, *EXTRA_PACKAGES])
def test_every_third_party_module_the_host_imports_comes_from_a_declared_dependency(
    subpackage: str | None,
) -> None:
    distributions = importlib.metadata.packages_distributions()
    declared = _declared(EXTRA_PACKAGES.get(subpackage or ""))
    undeclared = {
        module: distributions.get(module, [])
        for module in _third_party_imports(subpackage)
        if not declared & {_normal(d) for d in distributions.get(module, [])}
    }
    assert undeclared == {}


def test_psutil_is_not_a_runtime_dependency_and_the_cli_does_not_import_it() -> None:
    assert "psutil" not in _declared()
    probe = "import sys, orchestrator, orchestrator.cli; print('psutil' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr


def test_sandhold_version_prints_the_installed_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sandhold {importlib.metadata.version('sandhold')}"
