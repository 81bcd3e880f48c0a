"""Static rules of restricted mode, applied to the whole tree before anything runs. Every
violation is collected, each naming its rule and line. The walk is iterative and depth-bounded:
hostile input cannot exhaust the stack."""

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .modpolicy import FUTURE, ModulePolicy
from .rules import (
    CLASS_BODY_DUNDER_NAMES,
    DECORATOR_METHODS,
    DECORATOR_NAMES,
    DECORATOR_PATHS,
    DEFINABLE_DUNDER_METHODS,
    INTERNAL_ATTRS,
    READABLE_DUNDER_ATTRS,
    READABLE_DUNDER_NAMES,
    WRITABLE_DUNDER_ATTRS,
    is_dunder,
)

# Far deeper than code people write; shallow enough for compile() and the transform.
MAX_DEPTH = 200
Kind = Literal["validation", "import_blocked"]
# Nodes without children or rules.
_LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)


@dataclass(frozen=True)
class Violation:
    line: int
    message: str
    kind: Kind = "validation"

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


_Found = list[Violation]
_Handler = Callable[[ast.AST, bool, set[int], _Found], None]


class Validator:
    """Checks one tree against one policy's module and builtin rules."""

    def __init__(self, modules: ModulePolicy, forbidden_builtins: frozenset[str]) -> None:
        self._modules = modules
        self._forbidden = forbidden_builtins
        # One handler per node type that has a rule; every other node is only walked through.
        handlers: dict[type, Callable[..., None]] = {
            ast.Name: self._check_name,
            ast.Attribute: _check_attribute,
            ast.FunctionDef: self._check_definition,
            ast.AsyncFunctionDef: self._check_definition,
            ast.ClassDef: self._check_definition,
            ast.Import: self._check_import,
            ast.ImportFrom: self._check_import,
            ast.Assign: _exempt_class_names,
            ast.AnnAssign: _exempt_class_names,
            ast.AugAssign: _exempt_class_names,
        }
        for kind in _NAMED_NODES:
            handlers[kind] = _check_other
        self._handlers: dict[type, _Handler] = handlers

    def check(self, tree: ast.AST) -> list[Violation]:
        found: _Found = []
        exempt: set[int] = set()  # ids of Name nodes a class body may assign
        handlers = self._handlers
        stack: list[tuple[ast.AST, int, bool]] = [(tree, 0, False)]
        while stack:
            node, depth, in_class = stack.pop()
            if depth > MAX_DEPTH:
                found.append(Violation(_line(node), f"code is nested deeper than {MAX_DEPTH}"))
                break
            handler = handlers.get(type(node))
            if handler is not None:
                handler(node, in_class, exempt, found)
            body = node.body if isinstance(node, ast.ClassDef) else None
            for name in node._fields:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    inside = value is body
                    stack.extend(
                        (item, depth + 1, inside) for item in value if isinstance(item, ast.AST)
                    )
                elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                    stack.append((value, depth + 1, False))
        found.sort(key=lambda violation: violation.line)
        return found

    def _check_name(self, node: ast.Name, in_class: bool, exempt: set[int], found: _Found) -> None:
        if node.id in self._forbidden:
            found.append(Violation(_line(node), f"forbidden builtin '{node.id}' is not allowed"))
        elif is_dunder(node.id) and id(node) not in exempt:
            readable = isinstance(node.ctx, ast.Load) and node.id in READABLE_DUNDER_NAMES
            if not readable:
                found.append(Violation(_line(node), f"dunder name '{node.id}' is not allowed"))

    def _check_definition(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        in_class: bool,
        exempt: set[int],
        found: _Found,
    ) -> None:
        line = _line(node)
        if node.name in self._forbidden:
            found.append(Violation(line, f"forbidden builtin name '{node.name}' is not allowed"))
        elif is_dunder(node.name):
            method = in_class and not isinstance(node, ast.ClassDef)
            if not (method and node.name in DEFINABLE_DUNDER_METHODS):
                what = "dunder method" if method else "dunder name"
                found.append(Violation(line, f"{what} '{node.name}' is not allowed"))
        for decorator in node.decorator_list:
            if not _allowed_decorator(decorator):
                text = _describe(decorator)
                found.append(Violation(_line(decorator), f"decorator '{text}' is not allowed"))

    def _check_import(
        self, node: ast.Import | ast.ImportFrom, in_class: bool, exempt: set[int], found: _Found
    ) -> None:
        line = _line(node)
        if isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(Violation(line, "relative imports are not allowed", "import_blocked"))
                return
            module = node.module or ""
            self._check_module(module, line, found)
            for alias in node.names:
                if alias.name != "*" and module != FUTURE:
                    self._check_from_name(module, alias.name, line, found)
        else:
            for alias in node.names:
                self._check_module(alias.name, line, found)
        for alias in node.names:
            if alias.asname is not None:
                self._check_bound_name(alias.asname, line, found)

    def _check_module(self, name: str, line: int, found: list[Violation]) -> None:
        reason = self._modules.refusal(name)
        if reason is not None:
            found.append(
                Violation(line, f"import of '{name}' is blocked: {reason}", "import_blocked")
            )

    def _check_from_name(self, module: str, name: str, line: int, found: list[Violation]) -> None:
        if name.startswith("_"):
            found.append(Violation(line, f"importing private name '{name}' is not allowed"))
            return
        submodule = f"{module}.{name}"
        reason = self._modules.refusal(submodule)
        if reason is not None and "forbidden" in reason:
            found.append(
                Violation(line, f"import of '{submodule}' is blocked: {reason}", "import_blocked")
            )

    def _check_bound_name(self, name: str, line: int, found: list[Violation]) -> None:
        if name in self._forbidden:
            found.append(Violation(line, f"forbidden builtin name '{name}' is not allowed"))
        elif is_dunder(name):
            found.append(Violation(line, f"dunder name '{name}' is not allowed"))


def _exempt_class_names(
    node: ast.Assign | ast.AnnAssign | ast.AugAssign,
    in_class: bool,
    exempt: set[int],
    found: _Found,
) -> None:
    if not in_class:
        return
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
        if isinstance(target, ast.Name) and target.id in CLASS_BODY_DUNDER_NAMES:
            exempt.add(id(target))


def _check_attribute(node: ast.Attribute, in_class: bool, exempt: set[int], found: _Found) -> None:
    line = _line(node)
    attr = node.attr
    if attr in INTERNAL_ATTRS:
        found.append(Violation(line, f"interpreter internals attribute '{attr}' is not allowed"))
    elif is_dunder(attr):
        if isinstance(node.ctx, ast.Load):
            allowed = attr in READABLE_DUNDER_ATTRS or (
                _is_super_call(node.value) and attr in DEFINABLE_DUNDER_METHODS
            )
        else:
            allowed = isinstance(node.ctx, ast.Store) and attr in WRITABLE_DUNDER_ATTRS
        if not allowed:
            found.append(Violation(line, f"dunder attribute '{attr}' is not allowed"))


_NAMED_NODES = (
    ast.Global,
    ast.Nonlocal,
    ast.arg,
    ast.keyword,
    ast.ExceptHandler,
    ast.MatchAs,
    ast.MatchStar,
    ast.MatchMapping,
    ast.MatchClass,
)


def _check_other(node: ast.AST, in_class: bool, exempt: set[int], found: _Found) -> None:
    line = _line(node)
    names: list[str] = []
    if isinstance(node, ast.Global | ast.Nonlocal):
        for name in node.names:
            if is_dunder(name):
                kind = "global" if isinstance(node, ast.Global) else "nonlocal"
                found.append(Violation(line, f"{kind} declaration of '{name}' is not allowed"))
    elif isinstance(node, ast.arg | ast.keyword):
        names.append(node.arg or "")
    elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
        names.append(node.name or "")
    elif isinstance(node, ast.MatchMapping):
        names.append(node.rest or "")
    elif isinstance(node, ast.MatchClass):
        for attr in node.kwd_attrs:
            if attr.startswith("_") or attr in INTERNAL_ATTRS:
                found.append(Violation(line, f"class pattern attribute '{attr}' is not allowed"))
    for name in names:
        if is_dunder(name):
            found.append(Violation(line, f"dunder name '{name}' is not allowed"))


def _is_super_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _allowed_decorator(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        node = node.func
    path = _dotted(node)
    if path is None:
        return False
    if "." not in path:
        return path in DECORATOR_NAMES
    owner, _, method = path.rpartition(".")
    return path in DECORATOR_PATHS or ("." not in owner and method in DECORATOR_METHODS)


def _describe(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    text = _dotted(target) or type(target).__name__.lower()
    return f"{text}(...)" if isinstance(node, ast.Call) else text


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0) or 0
