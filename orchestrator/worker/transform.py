"""The AST rewrite of restricted mode: every attribute access goes through a guard bound in the
builtins under a dunder name, which user code cannot write and so cannot reach or shadow.

    obj.name              ->  __sbx_attr__(obj, 'name')
    obj.name = v          ->  __sbx_target__(obj).name = v        (also del, for, with, ...)
    obj.name += v         ->  __sbx_augattr__(obj, 'name', 'Add', v)
    match s: case a.B:    ->  __sbx_match_0__ = __sbx_match__(a.B)
                              match s: case __sbx_match_0__.v0:

Patterns of ``match`` statements may only hold dotted names, which the compiler reads without
any hook; their values are read (guarded) just before the statement. The class of a class
pattern with positional sub-patterns is also checked there (``__sbx_matchcls__``): the
interpreter reads the attributes its ``__match_args__`` names without any hook.

Private names are mangled here as the compiler would (``self.__x`` inside ``class C`` is
``_C__x``), since a string constant escapes the compiler's mangling. New nodes copy the
location of the node they replace, so tracebacks point at the user's line. The walk is
iterative; the validator bounds the depth.
"""

import ast
import itertools
from collections.abc import Iterator

ATTR_GUARD = "__sbx_attr__"
TARGET_GUARD = "__sbx_target__"
AUG_GUARD = "__sbx_augattr__"
MATCH_GUARD = "__sbx_match__"
MATCH_CLASS_GUARD = "__sbx_matchcls__"
_HOLDER = "__sbx_match_{}__"

_Item = tuple[ast.AST, str | None]
# Nodes without children worth visiting.
_LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)


def transform(tree: ast.Module) -> None:
    """Rewrite ``tree`` in place."""
    holders = itertools.count()
    stack: list[_Item] = [(tree, None)]
    while stack:
        node, owner = stack.pop()
        for field in node._fields:
            value = getattr(node, field, None)
            if field == "pattern" and isinstance(node, ast.match_case):
                continue  # patterns hold dotted names only; see _hoist_match
            scope = node.name if field == "body" and isinstance(node, ast.ClassDef) else owner
            if isinstance(value, list):
                value[:] = _rewrite_list(value, scope, holders)
                stack.extend((item, scope) for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.expr):
                new = _rewrite_expr(value, scope)
                if new is not value:
                    setattr(node, field, new)
                stack.append((new, scope))
            elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                stack.append((value, scope))


def _rewrite_list(
    items: list[object], owner: str | None, holders: Iterator[int]
) -> Iterator[object]:
    for item in items:
        if isinstance(item, ast.AugAssign) and isinstance(item.target, ast.Attribute):
            yield _augmented(item, owner)
        elif isinstance(item, ast.Match):
            yield from _hoist_match(item, next(holders))
        elif isinstance(item, ast.expr):
            yield _rewrite_expr(item, owner)
        else:
            yield item


def _rewrite_expr(node: ast.expr, owner: str | None) -> ast.expr:
    if not isinstance(node, ast.Attribute):
        return node
    if isinstance(node.ctx, ast.Load):
        name = _const(_mangle(node.attr, owner), node)
        return _call(ATTR_GUARD, [node.value, name], node)
    node.value = _call(TARGET_GUARD, [node.value], node.value)
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


def _hoist_match(node: ast.Match, number: int) -> list[ast.stmt]:
    holder = _HOLDER.format(number)
    values: list[ast.expr] = []

    def hold(value: ast.expr, *, always: bool = False) -> ast.expr:
        if not (always or isinstance(value, ast.Attribute)):
            return value
        values.append(value)
        base = ast.copy_location(ast.Name(holder, ast.Load()), value)
        return ast.copy_location(ast.Attribute(base, f"v{len(values) - 1}", ast.Load()), value)

    patterns: list[ast.pattern] = [case.pattern for case in node.cases]
    while patterns:
        pattern = patterns.pop()
        if isinstance(pattern, ast.MatchValue):
            pattern.value = hold(pattern.value)
        elif isinstance(pattern, ast.MatchMapping):
            pattern.keys = [hold(key) for key in pattern.keys]
        elif isinstance(pattern, ast.MatchClass) and pattern.patterns:
            count = ast.copy_location(ast.Constant(len(pattern.patterns)), pattern.cls)
            checked = _call(MATCH_CLASS_GUARD, [pattern.cls, count], pattern.cls)
            pattern.cls = hold(checked, always=True)
        elif isinstance(pattern, ast.MatchClass):
            pattern.cls = hold(pattern.cls)
        patterns.extend(
            child for child in ast.iter_child_nodes(pattern) if isinstance(child, ast.pattern)
        )
    if not values:
        return [node]
    store = ast.copy_location(ast.Name(holder, ast.Store()), node)
    assign = ast.Assign([store], _call(MATCH_GUARD, values, node))
    return [ast.copy_location(assign, node), node]


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
