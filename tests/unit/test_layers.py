"""The folder tree is the layer diagram, and the imports keep to it: each package imports only
the layers below it (TYPE_CHECKING imports included), the interfaces through the faces of the
packages below them, no module round a circle of imports, nothing outside ``backend/docker/``
touches the docker SDK or a private backend module, the in-container worker imports only the
standard library (and psutil, which its image carries), and every public module declares
``__all__``."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"

# Each top-level part of the package and the parts it may import (besides itself and the
# foundation, which every part above it may use). Read bottom up: errors and policy at the foot;
# backend, then a session's parts; what survives restarts and the audit log; the manager; the
# tool contract; the API; the interfaces on top. Every edge listed is used (a test says so), so
# the table is the diagram as it is, not as it once was.
FOUNDATION = {"errors", "_resources", "_lazy"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_resources": set(),
    "_lazy": set(),
    "worker": set(),
    # The client side of ``sandhold serve`` (its waits, its address, blocking calls): standard
    # library only, so ``sandhold mcp --connect`` starts fast; the remote Sandbox API uses it.
    "client": set(),
    "policy": set(),
    "backend": {"policy"},
    "images": {"backend"},
    "session": {"policy", "backend"},
    "registry": {"backend", "session"},
    "audit": {"session"},
    "_core": {"policy", "backend", "images", "session", "registry", "audit"},
    "tools": {"policy", "session", "_core"},
    "_api": {"backend", "_core", "tools", "audit"},
    "sync": {"_api", "tools"},
    # The typed sandbox API: a client of the tool layer, in-process (``call()``) or remote.
    "sandbox": {"_api", "sync", "tools", "client"},
    "policy_ci": {"policy", "session", "tools", "_api", "worker"},
    # The reference pages' generator reads the tool layer (and the models its results come
    # from), the policy model and the HTTP front's statuses; nothing imports it.
    "docs_reference": {"policy", "session", "_core", "tools", "http"},
}
# On top, each may import any part below, through its face only (``orchestrator._core``, not
# ``orchestrator._core.tenants``): a package's private modules are its own to move.
INTERFACES = {"cli", "http", "mcp_server", "__init__", "__main__"}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(relative.parts).removesuffix(".__init__")
        found.append((name, path))
    return found


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _internal_edges() -> list[tuple[str, str]]:
    edges = []
    for name, path in _modules():
        for imported in _imports(path):
            if imported == "orchestrator" or imported.startswith("orchestrator."):
                edges.append((name, imported))
    return edges


def _allowed(here: str, there: str) -> bool:
    if here == there or here in INTERFACES or there == "__init__":
        return True
    if there in FOUNDATION and here not in FOUNDATION:
        return True
    return there in ALLOWED.get(here, set())


def test_every_package_imports_only_the_layers_below_it() -> None:
    wrong = {f"{s} -> {t}" for s, t in _internal_edges() if not _allowed(_part(s), _part(t))}
    assert sorted(wrong) == []


def test_every_allowed_edge_is_used() -> None:
    used = {(_part(source), _part(target)) for source, target in _internal_edges()}
    unused = [
        f"{here} -> {there}"
        for here, allowed in ALLOWED.items()
        for there in sorted(allowed)
        if (here, there) not in used
    ]
    assert unused == []


def _imported_modules(path: Path) -> list[tuple[str, list[str]]]:
    """Each module ``path`` imports, with the names it takes from it (none for ``import m``)."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _behind_a_face(module: str, names: list[str]) -> bool:
    """Whether an import from another part goes through that part's face: a module with no
    private part below the top one (``orchestrator._core`` and ``orchestrator.images.listing``
    are faces, ``orchestrator._core.tenants`` and ``orchestrator.audit._log`` are not), and no
    private name taken from it."""
    parts = module.split(".")[1:]
    private_package = parts[0].startswith("_") and len(parts) > 1
    private_below = any(part.startswith("_") for part in parts[1:])
    return not (private_package or private_below or any(n.startswith("_") for n in names))


def test_interfaces_reach_other_parts_only_through_their_faces() -> None:
    wrong = []
    for name, path in _modules():
        here = _part(name)
        if here not in INTERFACES:
            continue
        for module, names in _imported_modules(path):
            if not module.startswith("orchestrator.") or _part(module) == here:
                continue
            if not _behind_a_face(module, names):
                wrong.append(f"{name} -> {module} {names}")
    assert wrong == []


# The faces the interfaces go through that are packages of private modules: each exports a
# sorted ``__all__`` (constants, classes, functions: ruff's RUF022) of names that resolve to what
# they name (a lazy face must not hand out a submodule of the same name).
PRIVATE_FACES = ("orchestrator._core", "orchestrator.client")


@pytest.mark.parametrize("face", PRIVATE_FACES)
def test_a_face_exports_a_sorted_all_whose_every_name_resolves(face: str) -> None:
    module = importlib.import_module(face)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    for name in exported:
        assert not isinstance(getattr(module, name), types.ModuleType), name


def test_the_manager_face_exports_what_the_parts_above_it_use() -> None:
    used: set[str] = set()
    for name, path in _modules():
        if not name.startswith("orchestrator._core"):
            for module, names in _imported_modules(path):
                used |= set(names) if module == "orchestrator._core" else set()
    assert sorted(used) == sorted(importlib.import_module("orchestrator._core").__all__)


def _module_graph() -> dict[str, set[str]]:
    """Each module and the modules it imports (TYPE_CHECKING imports included); an imported
    name counts as its module."""
    names = {name for name, _ in _modules()}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for source, target in _internal_edges():
        while target not in names and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in names and target != source:
            graph[source].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts with more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    assert _cycles(_module_graph()) == []


def test_a_circle_is_found() -> None:
    """The search itself: a circle of three and one of two, beside a module outside both."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_the_manager_never_imports_the_tool_layer() -> None:
    assert [e for e in _internal_edges() if _part(e[0]) == "_core" and _part(e[1]) == "tools"] == []


def test_only_the_docker_backend_imports_docker_or_private_backend_modules() -> None:
    wrong = []
    for name, path in _modules():
        if name.startswith("orchestrator.backend.docker"):
            continue
        for imported in _imports(path):
            private = imported.startswith("orchestrator.backend.") and any(
                part.startswith("_") for part in imported.split(".")[2:]
            )
            # A backend's own private modules are its own (backend.kubernetes._spec, say).
            own = name.split(".")[:3] == imported.split(".")[:3] and len(name.split(".")) > 2
            if imported.split(".")[0] == "docker" or (private and not own):
                wrong.append(f"{name} -> {imported}")
    assert wrong == []


# Above ``backend/``, the engine is chosen in one place (``_core/engines.py``); ``images/`` builds
# Docker images (``sandhold image``'s commands open its engine through ``images.engine``).
DOCKER_IMPORTERS = ("orchestrator._core.engines", "orchestrator.images")


def test_above_the_backends_only_the_engine_seam_and_images_name_docker() -> None:
    wrong = []
    for name, path in _modules():
        if name.startswith(("orchestrator.backend", *DOCKER_IMPORTERS)):
            continue
        for imported in _imports(path):
            if imported.startswith("orchestrator.backend.docker"):
                wrong.append(f"{name} -> {imported}")
    assert wrong == []


# The image installs psutil from a wheel for the process helper; nothing else is there.
WORKER_THIRD_PARTY = {"psutil"}


def test_the_worker_imports_only_the_standard_library_psutil_and_itself() -> None:
    wrong = []
    for name, path in _modules():
        if not name.startswith("orchestrator.worker"):
            continue
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top not in sys.stdlib_module_names | WORKER_THIRD_PARTY | {"__future__"}:
                wrong.append(f"{name} -> {imported}")
    assert wrong == []


def test_the_client_imports_only_the_standard_library_the_errors_and_itself() -> None:
    """``sandhold mcp --connect`` starts through ``orchestrator.client`` on every call of a client
    that spawns a server per call: nothing heavier may come in with it."""
    wrong = []
    for name, path in _modules():
        if not name.startswith("orchestrator.client"):
            continue
        for imported in _imports(path):
            if imported.startswith(("orchestrator.client", "orchestrator.errors")):
                continue
            if imported.split(".")[0] not in sys.stdlib_module_names | {"__future__"}:
                wrong.append(f"{name} -> {imported}")
    assert wrong == []


def _public_modules() -> list[str]:
    """Modules outside the worker whose dotted name has no private part (``_x``): a private
    module is spoken for by its package's ``__all__``."""
    return [
        name
        for name, _ in _modules()
        if not name.startswith("orchestrator.worker")
        and not any(part.startswith("_") for part in name.split(".")[1:])
    ]


@pytest.mark.parametrize("name", _public_modules())
def test_every_public_module_declares_all(name: str) -> None:
    tree = ast.parse(dict(_modules())[name].read_text())
    declared = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and any(
            isinstance(t, ast.Name) and t.id == "__all__"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    assert declared, f"{name} has no __all__"
