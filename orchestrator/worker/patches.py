"""Process-wide patches for restricted mode, for library code that evaluates strings or walks
attributes by name on behalf of user code, whatever path led there:
- ``typing.ForwardRef._evaluate``: string annotations are passed to ``eval()`` by
  ``typing.get_type_hints`` and ``functools.singledispatch``; only dotted names, subscripts,
  tuples and ``|`` unions of public names pass, and the result is screened by the guard. A
  globals dict without ``__builtins__`` (``get_type_hints(f, globalns={})``) gets the restricted
  ones first: ``eval()`` would otherwise put the real builtins in a dict the caller holds.
- ``string.Formatter.get_field``: field traversal (``{0.attr}``) goes through the guard.
- ``dataclasses._process_class``: field names are pasted into generated source code; only plain
  identifiers pass, and classes built by a user-defined metaclass are refused.
The worker installs them once; tests undo them with the callable ``install`` returns."""

import ast
import dataclasses
import keyword
import string
import typing
from collections.abc import Callable
from typing import Any

from .errors import GuardError
from .guards import USER_MODULE, AttributeGuard, class_module
from .rules import is_dunder
from .safe_callables import guarded_get_field

# Longer than any real annotation; keeps the parse below cheap.
MAX_FORWARD_REF_CHARS = 500
_FORWARD_REF_NODES = (
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
_FIELDS = "__dataclass_fields__"


def check_forward_ref(text: object) -> None:
    """Refuse a string annotation that is anything but a plain type expression."""
    if not isinstance(text, str) or len(text) > MAX_FORWARD_REF_CHARS:
        raise GuardError("string annotations must be short strings")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise GuardError(f"string annotation {text[:80]!r} is not a type expression") from None
    for node in ast.walk(tree):
        allowed = isinstance(node, _FORWARD_REF_NODES) and not (
            isinstance(node, ast.BinOp) and not isinstance(node.op, ast.BitOr)
        )
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        if not allowed or (isinstance(name, str) and name.startswith("_")):
            raise GuardError(f"string annotation {text[:80]!r} is not a plain type expression")


def check_dataclass_fields(cls: object) -> None:
    """Refuse a class whose dataclass field names are not plain identifiers."""
    if not isinstance(cls, type):
        return
    mro = cls.__mro__
    if any(class_module(type(base)) == USER_MODULE for base in mro):
        raise GuardError("dataclasses with a metaclass defined in this session are not allowed")
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (the raw dict, no hooks)
    if type(annotations) is not dict:
        raise GuardError("dataclass annotations must be a plain dict")
    names: list[object] = list(annotations)
    for base in mro[1:]:
        fields = getattr(base, _FIELDS, None)
        if fields is None:
            continue
        if type(fields) is not dict:
            raise GuardError(f"{_FIELDS} of a base class must be a plain dict")
        names.extend(getattr(field, "name", None) for field in fields.values())
    for name in names:
        if not _plain_identifier(name):
            raise GuardError(f"dataclass field name {name!r} is not a plain identifier")


def _plain_identifier(name: object) -> bool:
    return (
        type(name) is str
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not is_dunder(name)
    )


def install(guard: AttributeGuard, safe_builtins: dict[str, object]) -> Callable[[], None]:
    """Apply the patches; return a callable that takes them back."""
    undo: list[tuple[type | object, str, object]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return  # not in this Python version: nothing to guard
        undo.append((owner, name, original))
        setattr(owner, name, make(original))

    patch(
        typing.ForwardRef,
        "_evaluate",
        lambda original: _forward_ref(guard, safe_builtins, original),
    )
    patch(string.Formatter, "get_field", lambda original: _get_field(guard))
    patch(dataclasses, "_process_class", _process_class)

    def restore() -> None:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)

    return restore


def _forward_ref(
    guard: AttributeGuard, safe_builtins: dict[str, object], original: Callable[..., object]
) -> Callable[..., object]:
    def _evaluate(self: typing.ForwardRef, *args: Any, **kwargs: Any) -> object:
        check_forward_ref(self.__forward_arg__)
        globalns = kwargs.get("globalns", args[0] if args else None)
        if isinstance(globalns, dict) and "__builtins__" not in globalns:
            globalns["__builtins__"] = safe_builtins
        return guard.screen(original(self, *args, **kwargs), "a string annotation")

    return _evaluate


def _get_field(guard: AttributeGuard) -> Callable[..., tuple[Any, str]]:
    def get_field(
        self: string.Formatter, field_name: str, args: Any, kwargs: Any
    ) -> tuple[Any, str]:
        return guarded_get_field(self, guard, field_name, args, kwargs)

    return get_field


def _process_class(original: Callable[..., object]) -> Callable[..., object]:
    def process_class(cls: type, *args: Any, **kwargs: Any) -> object:
        check_dataclass_fields(cls)
        return original(cls, *args, **kwargs)

    return process_class
