"""The AST rewrite of restricted mode: every attribute access goes through a guard bound in the
builtins under a dunder name, which user code cannot write and so cannot reach or shadow.

    obj.name              ->  __sandhold_attr__(obj, 'name')
    obj.name = v          ->  __sandhold_target__(obj).name = v     (also del, for, with, ...)
    obj.name += v         ->  __sandhold_augattr__(obj, 'name', 'Add', v)
    f(a, b), f(*a)        ->  __sandhold_callee__(f)(a, b)
                              (the call shapes that can make a class, or hand a metaclass to a
                              callable with arguments: 2 to 5 positional arguments, or unpacked
                              ones; classes.py)
    match s: case a.B:    ->  __sandhold_match_0__ = __sandhold_match__(a.B)
                              match s: case __sandhold_match_0__.v0:

Patterns of ``match`` statements may only hold dotted names, which the compiler reads without
any hook; their values are read (guarded) just before the statement. The class of a class
pattern with sub-patterns is replaced there by the guard's stand-in (``__sandhold_matchcls__``):
the interpreter reads the subject's attributes without any hook. What such a pattern binds is
screened before the case's guard and body run: ``case C(x) if g:`` becomes
``case C(x) if (x := __sandhold_capture__(x),) and g:``.

A class body looks its names up in the namespace its metaclass's ``__prepare__`` made, so each
class body declares the guard names (and its ``match`` holders) ``global``: they are always the
builtins' own.

Private names are mangled here as the compiler would (``self.__x`` inside ``class C`` is
``_C__x``), since a string constant escapes the compiler's mangling. New nodes copy the
location of the node they replace, so tracebacks point at the user's line. The walk is
iterative; the validator bounds the depth.
"""

import ast
import itertools
from collections.abc import Iterator

ATTR_GUARD = "__sandhold_attr__"
TARGET_GUARD = "__sandhold_target__"
AUG_GUARD = "__sandhold_augattr__"
MATCH_GUARD = "__sandhold_match__"
MATCH_CLASS_GUARD = "__sandhold_matchcls__"
CAPTURE_GUARD = "__sandhold_capture__"
CALL_GUARD = "__sandhold_callee__"
GUARD_NAMES = (
    ATTR_GUARD,
    TARGET_GUARD,
    AUG_GUARD,
    MATCH_GUARD,
    MATCH_CLASS_GUARD,
    CAPTURE_GUARD,
    CALL_GUARD,
)
_HOLDER = "__sandhold_match_{}__"
# Calls with this many positional arguments can make a class, ``type(name, bases, ns)``,
# ``type.__new__(meta, name, bases, ns)``, or hand a metaclass on with what it will be called
# with: ``functools.partial(type, 'T')``, ``itertools.starmap(type, rows)``,
# ``operator.call(type.__new__, meta, name, bases, ns)``.
_CLASS_MAKING_ARGS = (2, 3, 4, 5)

# A node, the class whose private names it mangles, and the class whose body is its scope.
_Item = tuple[ast.AST, str | None, ast.ClassDef | None]
# Nodes without children worth visiting.
_LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class _Holders:
    """Numbers the ``match`` holders of one tree and notes which class bodies use which."""

    def __init__(self) -> None:
        self._numbers = itertools.count()
        self.in_class: dict[int, list[str]] = {}

    def new(self, scope: ast.ClassDef | None) -> str:
        name = _HOLDER.format(next(self._numbers))
        if scope is not None:
            self.in_class.setdefault(id(scope), []).append(name)
        return name


def transform(tree: ast.Module) -> None:
    """Rewrite ``tree`` in place."""
    holders = _Holders()
    classes: list[ast.ClassDef] = []
    stack: list[_Item] = [(tree, None, None)]
    while stack:
        node, owner, scope = stack.pop()
        if isinstance(node, ast.ClassDef):
            classes.append(node)
        for field in node._fields:
            value = getattr(node, field, None)
            if field == "pattern" and isinstance(node, ast.match_case):
                continue  # patterns hold dotted names only; see _hoist_match
            mangler, inner = owner, scope
            if field == "body" and isinstance(node, ast.ClassDef):
                mangler, inner = node.name, node
            elif field == "body" and isinstance(node, _FUNCTIONS):
                inner = None
            if isinstance(value, list):
                value[:] = _rewrite_list(value, mangler, inner, holders)
                stack.extend((item, mangler, inner) for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.expr):
                new = _rewrite_expr(value, mangler)
                if new is not value:
                    setattr(node, field, new)
                stack.append((new, mangler, inner))
            elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                stack.append((value, mangler, inner))
    for cls in classes:
        _declare_globals(cls, holders.in_class.get(id(cls), []))


def _declare_globals(cls: ast.ClassDef, holders: list[str]) -> None:
    body = cls.body
    first = body[0] if body else None
    docstring = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    declaration = ast.copy_location(ast.Global([*GUARD_NAMES, *holders]), first or cls)
    body.insert(1 if docstring else 0, declaration)


def _rewrite_list(
    items: list[object], owner: str | None, scope: ast.ClassDef | None, holders: _Holders
) -> Iterator[object]:
    for item in items:
        if isinstance(item, ast.AugAssign) and isinstance(item.target, ast.Attribute):
            yield _augmented(item, owner)
        elif isinstance(item, ast.Match):
            yield from _hoist_match(item, holders.new(scope))
        elif isinstance(item, ast.expr):
            yield _rewrite_expr(item, owner)
        else:
            yield item


def _rewrite_expr(node: ast.expr, owner: str | None) -> ast.expr:
    if isinstance(node, ast.Call):
        return _guarded_call(node)
    if not isinstance(node, ast.Attribute):
        return node
    if isinstance(node.ctx, ast.Load):
        name = _const(_mangle(node.attr, owner), node)
        return _call(ATTR_GUARD, [node.value, name], node)
    node.value = _call(TARGET_GUARD, [node.value], node.value)
    return node


def _guarded_call(node: ast.Call) -> ast.expr:
    func = node.func
    if isinstance(func, ast.Name) and func.id in GUARD_NAMES:
        return node  # a call this rewrite made
    unpacked = any(isinstance(arg, ast.Starred) for arg in node.args) or any(
        keyword.arg is None for keyword in node.keywords
    )
    if not unpacked and len(node.args) not in _CLASS_MAKING_ARGS:
        return node
    node.func = _call(CALL_GUARD, [func], func)
    return node


def _augmented(node: ast.AugAssign, owner: str | None) -> ast.stmt:
    target = node.target
    assert isinstance(target, ast.Attribute)
    args = [
        target.value,
        _const(_mangle(target.attr, owner), target),
        _const(type(node.op).__name__, node),
        node.value,
    ]
    return ast.copy_location(ast.Expr(_call(AUG_GUARD, args, node)), node)


def _hoist_match(node: ast.Match, holder: str) -> list[ast.stmt]:
    values: list[ast.expr] = []

    def hold(value: ast.expr, *, always: bool = False) -> ast.expr:
        if not (always or isinstance(value, ast.Attribute)):
            return value
        values.append(value)
        base = ast.copy_location(ast.Name(holder, ast.Load()), value)
        return ast.copy_location(ast.Attribute(base, f"v{len(values) - 1}", ast.Load()), value)

    for case in node.cases:
        reads_attributes = False
        patterns: list[ast.pattern] = [case.pattern]
        while patterns:
            pattern = patterns.pop()
            if isinstance(pattern, ast.MatchValue):
                pattern.value = hold(pattern.value)
            elif isinstance(pattern, ast.MatchMapping):
                pattern.keys = [hold(key) for key in pattern.keys]
            elif isinstance(pattern, ast.MatchClass) and (pattern.patterns or pattern.kwd_patterns):
                reads_attributes = True
                count = ast.copy_location(ast.Constant(len(pattern.patterns)), pattern.cls)
                checked = _call(MATCH_CLASS_GUARD, [pattern.cls, count], pattern.cls)
                pattern.cls = hold(checked, always=True)
            elif isinstance(pattern, ast.MatchClass):
                pattern.cls = hold(pattern.cls)
            patterns.extend(
                child for child in ast.iter_child_nodes(pattern) if isinstance(child, ast.pattern)
            )
        if reads_attributes:
            _screen_captures(case)
    if not values:
        return [node]
    store = ast.copy_location(ast.Name(holder, ast.Store()), node)
    assign = ast.Assign([store], _call(MATCH_GUARD, values, node))
    return [ast.copy_location(assign, node), node]


def _screen_captures(case: ast.match_case) -> None:
    """Rebind every name the case's pattern captures to its screened value, before the guard."""
    names: list[str] = []
    for pattern in ast.walk(case.pattern):
        if isinstance(pattern, ast.MatchAs | ast.MatchStar) and pattern.name:
            names.append(pattern.name)
        elif isinstance(pattern, ast.MatchMapping) and pattern.rest:
            names.append(pattern.rest)
    if not names:
        return
    where = case.pattern
    rebinds: list[ast.expr] = [
        ast.NamedExpr(
            ast.Name(name, ast.Store()), _call(CAPTURE_GUARD, [ast.Name(name, ast.Load())], where)
        )
        for name in names
    ]
    screened: ast.expr = ast.Tuple(rebinds, ast.Load())
    if case.guard is not None:
        screened = ast.BoolOp(ast.And(), [screened, case.guard])
    case.guard = screened
    for node in ast.walk(screened):
        if "lineno" in node._attributes and not hasattr(node, "lineno"):
            ast.copy_location(node, where)


def _mangle(name: str, owner: str | None) -> str:
    if owner is None or not name.startswith("__") or name.endswith("__"):
        return name
    stripped = owner.lstrip("_")
    return f"_{stripped}{name}" if stripped else name


def _call(function: str, args: list[ast.expr], where: ast.AST) -> ast.Call:
    func = ast.copy_location(ast.Name(function, ast.Load()), where)
    return ast.copy_location(ast.Call(func, args, []), where)


def _const(value: str, where: ast.AST) -> ast.Constant:
    return ast.copy_location(ast.Constant(value), where)
