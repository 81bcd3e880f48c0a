"""What the host can learn about the user namespace without running more user code than it must:
bounded reprs, type names, the variable list, and ``inspect`` of one name. Every exception
raised while looking becomes a field of the answer."""

import reprlib
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .interrupts import InterruptGate
from .rules import class_module

# Above this many elements or characters a builtin container is shown abridged (by reprlib),
# so a repr costs bounded time and memory whatever the value holds.
_MAX_REPR_ELEMENTS = 10_000
_MAX_REPR_TEXT = 1_000_000
_CONTAINERS = (list, tuple, set, frozenset, deque)
# A namespace with more names than this is listed in part, flagged truncated.
MAX_LISTED = 5_000
_MAX_DETAIL_CHARS = 1_000


def _abridged_repr(limit: int) -> reprlib.Repr:
    shortener = reprlib.Repr()
    shortener.maxlevel = 6
    for name in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset"):
        setattr(shortener, name, 100)
    shortener.maxdeque = 100
    shortener.maxstring = shortener.maxother = shortener.maxlong = max(limit, 40)
    return shortener


def _cheap_to_repr(value: object) -> bool:
    """True when repr() of a value made of builtin containers stays small."""
    budget, chars = _MAX_REPR_ELEMENTS, _MAX_REPR_TEXT
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        kind = type(item)
        if kind in (str, bytes, bytearray):
            chars -= len(item)  # type: ignore[arg-type]
        elif kind is int:
            chars -= item.bit_length() // 3  # type: ignore[attr-defined]
        elif kind in _CONTAINERS or kind is dict:
            size = len(item)  # type: ignore[arg-type]
            if size > budget:
                return False
            container: Any = item
            stack.extend(container.items() if kind is dict else container)
        if budget < 0 or chars < 0:
            return False
    return True


def bounded_repr(value: object, limit: int) -> str:
    """repr() cut to ``limit`` characters; huge builtin containers are abridged first."""
    if type(value) in (*_CONTAINERS, dict, str, bytes, int) and not _cheap_to_repr(value):
        try:
            text = _abridged_repr(limit).repr(value)
        except ValueError:  # an int beyond the digit limit
            text = f"<{type(value).__name__} too large to show>"
    else:
        text = repr(value)
    if not isinstance(text, str):
        raise TypeError("__repr__ returned a non-string")
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def type_name(value: object) -> str:
    """``int``, ``Point`` (defined in the session) or ``collections.OrderedDict``."""
    kind = type(value)
    module = class_module(kind)
    qualname = getattr(kind, "__qualname__", kind.__name__)
    if module in ("builtins", "__main__") or not isinstance(module, str):
        return str(qualname)
    return f"{module}.{qualname}"


def list_variables(namespace: dict[str, Any]) -> dict[str, Any]:
    names = sorted(name for name in namespace if isinstance(name, str) and name[:1] != "_")
    variables: list[dict[str, str]] = []
    modules: list[str] = []
    for name in names:
        value = namespace[name]
        if isinstance(value, ModuleType):
            modules.append(name)
        else:
            variables.append({"name": name, "type": type_name(value)})
    truncated = len(variables) > MAX_LISTED or len(modules) > MAX_LISTED
    return {
        "variables": variables[:MAX_LISTED],
        "modules": modules[:MAX_LISTED],
        "truncated": truncated,
    }


def _describe_error(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:_MAX_DETAIL_CHARS]
    except BaseException:  # a user __str__ that raises
        return type(exc).__name__


def _attempt(gate: InterruptGate, fields: dict[str, Any], key: str, get: Callable[[], Any]) -> None:
    """Store ``get()`` under ``key``, or its failure under ``key + '_error'``."""
    try:
        value = gate.call(get)
    except BaseException as exc:  # user code raised it (even SystemExit): it is a result
        fields[f"{key}_error"] = _describe_error(exc)
        return
    if value is not None:
        fields[key] = value


def _static_has(value: object, name: str) -> bool:
    """True when ``name`` is a real attribute (instance dict or class), not a __getattr__ answer."""
    try:
        instance_dict = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        instance_dict = None
    if isinstance(instance_dict, dict) and name in instance_dict:
        return True
    return any(name in vars(klass) for klass in type(value).__mro__)


def inspect_value(
    namespace: dict[str, Any], name: str, limit: int, gate: InterruptGate
) -> dict[str, Any]:
    if name.startswith("__") or name not in namespace:
        return {"found": False, "name": name}
    value: Any = namespace[name]
    fields: dict[str, Any] = {"found": True, "name": name, "type_name": type_name(value)}
    _attempt(gate, fields, "repr", lambda: bounded_repr(value, limit))
    if "repr" not in fields:
        fields["repr"] = f"<repr() failed: {fields.get('repr_error', '')}>"
    if _static_has(value, "__len__"):
        _attempt(gate, fields, "length", lambda: len(value))
    if callable(value):
        _attempt(gate, fields, "doc", lambda: _first_doc_line(value))
        _attempt(gate, fields, "signature", lambda: _signature(value))
    if _static_has(value, "shape"):
        _attempt(gate, fields, "shape", lambda: _shape(value.shape))
    if _static_has(value, "dtype"):
        _attempt(gate, fields, "dtype", lambda: str(value.dtype)[:_MAX_DETAIL_CHARS])
    return fields


def _first_doc_line(value: object) -> str | None:
    doc = getattr(value, "__doc__", None)
    if not isinstance(doc, str):
        return None
    lines = [line.strip() for line in doc.strip().splitlines()]
    return lines[0][:_MAX_DETAIL_CHARS] if lines else None


def _signature(value: Any) -> str | None:
    import inspect  # only when someone asks: it costs milliseconds to import

    try:
        return str(inspect.signature(value))[:_MAX_DETAIL_CHARS]
    except (TypeError, ValueError):  # builtins without a signature
        return None


def _shape(shape: object) -> object:
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        return list(shape)
    return bounded_repr(shape, _MAX_DETAIL_CHARS)
