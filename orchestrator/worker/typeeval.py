"""String annotations evaluated for restricted code, without ``eval()``.

``typing.get_type_hints`` (and ``functools.singledispatch``, which uses it) hands string
annotations to ``ForwardRef._evaluate`` with a namespace it picked itself: a function's
globals, the module a class claims in ``__module__``, the module a ``ForwardRef(module=...)``
names. Evaluated with ``eval()`` there, ``ForwardRef('system', module='os')`` is ``os.system``.

Here, instead:
- the annotation must parse to a plain type expression: dotted public names, subscripts,
  tuples, lists, constants and ``|``;
- it is evaluated by walking that tree: names are looked up in the namespaces given, attributes
  are read through the guard (``typing.sys`` is refused), every value is screened;
- a namespace is used only through :class:`GuardedNamespace`: the session's namespace and plain
  mappings are read as mappings, a module's namespace only as that module's attributes, so a
  module outside the policy refuses every name (``import_blocked``);
- ``typing._eval_type`` is wrapped too, so a ``ForwardRef`` subclass with its own ``_evaluate``
  is handed guarded namespaces, never a module's dictionary, and every evaluated annotation is
  screened on its way out.
"""

import ast
import builtins
import operator
import sys
import typing
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from .errors import GuardError, ImportBlockedError
from .guards import AttributeGuard
from .rules import exact_str

# Longer than any real annotation; keeps the parse below cheap.
MAX_FORWARD_REF_CHARS = 500
_NODES = (
    ast.Expression,
    ast.Name,
    ast.Attribute,
    ast.Subscript,
    ast.Tuple,
    ast.List,
    ast.Constant,
    ast.BinOp,
    ast.BitOr,
    ast.Load,
)
_MODULE_DICT: Any = vars(ModuleType)["__dict__"]
_REAL_BUILTINS: tuple[object, ...] = (builtins, builtins.__dict__)
_HOW = "a string annotation"


def parse_annotation(text: object) -> ast.expr:
    """The tree of a string annotation, refused unless it is a plain type expression."""
    plain = exact_str(text, "a string annotation")
    if len(plain) > MAX_FORWARD_REF_CHARS:
        raise GuardError("string annotations must be short strings")
    try:
        tree = ast.parse(plain, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise GuardError(f"string annotation {plain[:80]!r} is not a type expression") from None
    for node in ast.walk(tree):
        allowed = isinstance(node, _NODES) and not (
            isinstance(node, ast.BinOp) and not isinstance(node.op, ast.BitOr)
        )
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        if not allowed or (isinstance(name, str) and name.startswith("_")):
            raise GuardError(f"string annotation {plain[:80]!r} is not a plain type expression")
    return tree.body


class GuardedNamespace:
    """A namespace a string annotation may look names up in. A ``ForwardRef`` subclass's own
    ``_evaluate`` may be handed one: it gives out nothing the guard would not."""

    __slots__ = ("_guard", "_mapping", "_module")

    def __init__(
        self, guard: AttributeGuard, mapping: object = None, module: ModuleType | None = None
    ) -> None:
        self._guard = guard
        self._mapping = mapping
        self._module = module

    def lookup(self, name: str) -> object:
        """The screened value of ``name``; KeyError when it is not here."""
        plain = exact_str(name)
        if self._module is not None:
            if plain not in _MODULE_DICT.__get__(self._module, ModuleType):
                raise KeyError(plain)
            return self._guard.attr(self._module, plain)
        mapping: Any = self._mapping
        return self._guard.screen(mapping[plain], _HOW)


def _module_of(namespace: object) -> ModuleType | None:
    for module in list(sys.modules.values()):
        if issubclass(type(module), ModuleType) and (
            _MODULE_DICT.__get__(module, ModuleType) is namespace
        ):
            return module
    return None


class Annotations:
    """String-annotation evaluation for one session."""

    def __init__(self, guard: AttributeGuard, safe_builtins: dict[str, object]) -> None:
        self._guard = guard
        self._builtins = safe_builtins

    def namespace(self, given: object) -> GuardedNamespace | None:
        """The guarded form of a namespace library code passed along."""
        if given is None or type(given) is GuardedNamespace:
            return given
        guard = self._guard
        if given is guard.namespace:
            return GuardedNamespace(guard, mapping=given)
        if any(given is real for real in _REAL_BUILTINS):
            raise ImportBlockedError("string annotations cannot be evaluated in the builtins")
        module = _module_of(given)
        if module is not None:
            return GuardedNamespace(guard, module=module)
        held = given.get("__builtins__") if type(given) is dict else None
        if any(held is real for real in _REAL_BUILTINS):
            # A module's globals that sys.modules no longer holds: nothing says what it is.
            raise ImportBlockedError(
                "string annotations cannot be evaluated in the namespace of an unknown module"
            )
        if not isinstance(given, Mapping) and not hasattr(given, "__getitem__"):
            raise GuardError("a string annotation's namespace must be a mapping")
        return GuardedNamespace(guard, mapping=given)

    def module_namespace(self, name: object) -> GuardedNamespace:
        """The namespace of ``ForwardRef(..., module=name)``."""
        plain = exact_str(name, "module name")
        module = sys.modules.get(plain)
        if module is None or not issubclass(type(module), ModuleType):
            raise ImportBlockedError(f"module '{plain}' of a string annotation is not imported")
        namespace = self.namespace(_MODULE_DICT.__get__(module, ModuleType))
        assert namespace is not None
        return namespace

    def evaluate(self, text: object, scopes: tuple[GuardedNamespace | None, ...]) -> object:
        """The value of a string annotation, looked up in ``scopes`` then the builtins."""
        return self._value(parse_annotation(text), scopes)

    def _value(self, node: ast.expr, scopes: tuple[GuardedNamespace | None, ...]) -> object:
        guard = self._guard
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id, scopes)
        if isinstance(node, ast.Attribute):
            return guard.attr(self._value(node.value, scopes), node.attr)
        if isinstance(node, ast.Subscript):
            container: Any = self._value(node.value, scopes)
            return guard.screen(container[self._value(node.slice, scopes)], _HOW)
        if isinstance(node, ast.Tuple):
            return tuple(self._value(item, scopes) for item in node.elts)
        if isinstance(node, ast.List):
            return [self._value(item, scopes) for item in node.elts]
        if isinstance(node, ast.BinOp):
            left = self._value(node.left, scopes)
            return guard.screen(operator.or_(left, self._value(node.right, scopes)), _HOW)
        raise GuardError("string annotations must be plain type expressions")

    def _name(self, name: str, scopes: tuple[GuardedNamespace | None, ...]) -> object:
        for scope in scopes:
            if scope is None:
                continue
            try:
                return scope.lookup(name)
            except KeyError:
                continue
        try:
            return self._builtins[name]
        except KeyError:
            raise NameError(f"name '{name}' is not defined", name=name) from None

    def forward_ref_evaluate(
        self, original_eval_type: Callable[..., object]
    ) -> Callable[..., object]:
        """A ``ForwardRef._evaluate`` built on :meth:`evaluate`."""
        annotations = self

        def _evaluate(ref: typing.ForwardRef, *args: Any, **kwargs: Any) -> object:
            names = ("globalns", "localns")
            given = {key: kwargs.pop(key) for key in names if key in kwargs}
            for key, value in zip(names, args, strict=False):
                given[key] = value
            rest = args[2:]
            guard_set = kwargs.pop("recursive_guard", rest[0] if rest else frozenset())
            if len(rest) > 1:  # 3.12+: (globalns, localns, type_params, *, recursive_guard)
                guard_set = kwargs.pop("recursive_guard", frozenset())
                kwargs["type_params"] = rest[0]
            arg = exact_str(ref.__forward_arg__, "a string annotation")
            if arg in guard_set:
                return ref
            globalns = annotations.namespace(given.get("globalns"))
            localns = annotations.namespace(given.get("localns"))
            module = ref.__forward_module__
            if module is not None:
                globalns = annotations.module_namespace(module)
            value = annotations.evaluate(arg, (localns, globalns))
            checked = typing._type_check(  # type: ignore[attr-defined]
                value,
                "Forward references must evaluate to types.",
                is_argument=ref.__forward_is_argument__,
                allow_special_forms=getattr(ref, "__forward_is_class__", False),
            )
            return original_eval_type(
                checked, globalns, localns, recursive_guard=guard_set | {arg}, **kwargs
            )

        return _evaluate

    def eval_type(self, original: Callable[..., object]) -> Callable[..., object]:
        """``typing._eval_type`` handing on guarded namespaces and screening what it returns."""
        annotations = self

        def _eval_type(
            t: object, globalns: object, localns: object, *args: Any, **kw: Any
        ) -> object:
            value = original(
                t, annotations.namespace(globalns), annotations.namespace(localns), *args, **kw
            )
            return annotations._guard.screen(value, _HOW)

        return _eval_type
