"""Guarded stand-ins for callables that reach attributes by a name given as a string: format
fields (``"{0.__class__}".format(x)``), ``operator.attrgetter`` / ``methodcaller``,
``functools.update_wrapper`` / ``wraps`` with custom attribute lists, ``enum.global_enum``, and
the builtins ``getattr``, ``setattr``, ``delattr``, ``vars``, ``dir``. Each takes names as plain
``str`` copies (a str subclass could answer the checks one way and the C code another), refuses
private and dunder names and hands every value it reaches to the guard."""

import _string  # type: ignore[import-not-found]  # the C parser behind str.format
import builtins
import enum
import functools
import operator
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import GuardError
from .guards import AttributeGuard, has_standard_metaclass, is_module, is_session_class
from .rules import exact_str

_MISSING: Any = object()
# str.format allows one level of nested fields inside a format spec; one more costs nothing.
_MAX_SPEC_DEPTH = 2


def _traverses_attributes(template: str, depth: int = 0) -> bool:
    """True when a format string reads an attribute of an argument (``{0.x}``); raises
    ValueError when the template is malformed, as str.format would."""
    for _literal, field, spec, _conversion in _string.formatter_parser(template):
        if field:
            _first, rest = _string.formatter_field_name_split(field)
            if any(is_attr for is_attr, _key in rest):
                return True
        nested = spec and "{" in spec and depth < _MAX_SPEC_DEPTH
        if nested and _traverses_attributes(spec, depth + 1):
            return True
    return False


class GuardedFormatter(string.Formatter):
    """string.Formatter whose field traversal goes through the guard."""

    def __init__(self, guard: AttributeGuard) -> None:
        self._guard = guard

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        return guarded_get_field(self, self._guard, field_name, args, kwargs)


def guarded_get_field(
    formatter: string.Formatter, guard: AttributeGuard, field_name: str, args: Any, kwargs: Any
) -> tuple[Any, str]:
    first, rest = _string.formatter_field_name_split(field_name)
    obj = formatter.get_value(first, args, kwargs)
    for is_attr, key in rest:
        obj = guard.attr_by_name(obj, key) if is_attr else obj[key]
    return obj, first


class FormatMethods:
    """str.format and str.format_map, unbound and bound, with guarded field traversal. Templates
    that read no attribute take the C fast path."""

    def __init__(self, guard: AttributeGuard) -> None:
        self._formatter = GuardedFormatter(guard)

    def format(self, template: object, /, *args: object, **kwargs: object) -> str:
        text = _as_str(template, "format")
        if _safe_template(text):
            return text.format(*args, **kwargs)
        return self._formatter.vformat(text, args, kwargs)

    def format_map(self, template: object, mapping: Mapping[str, object], /) -> str:
        text = _as_str(template, "format_map")
        if _safe_template(text):
            return text.format_map(mapping)
        return self._formatter.vformat(text, (), mapping)

    def bind(self, template: str, method: str) -> object:
        if method == "format":
            return functools.partial(self.format, template)
        return functools.partial(self.format_map, template)


def _as_str(template: object, method: str) -> str:
    if not isinstance(template, str):
        kind = type(template).__name__
        raise TypeError(f"descriptor '{method}' for 'str' objects doesn't apply to a '{kind}'")
    return exact_str(template)


def _safe_template(template: str) -> bool:
    try:
        return not _traverses_attributes(template)
    except ValueError:
        return True  # malformed: let str.format raise its own error


def _check_name(name: object) -> str:
    checked = exact_str(name, "attribute name")
    for part in checked.split("."):
        if not part or part[0] == "_":
            raise GuardError(f"attribute '{checked}' may not be reached by name")
    return checked


def make_attrgetter(guard: AttributeGuard) -> Callable[..., Callable[[object], object]]:
    def attrgetter(attr: object, /, *attrs: object) -> Callable[[object], object]:
        paths = [_check_name(name).split(".") for name in (attr, *attrs)]

        def resolve(obj: object, path: list[str]) -> object:
            for part in path:
                obj = guard.attr_by_name(obj, part)
            return obj

        if len(paths) == 1:
            return lambda obj: resolve(obj, paths[0])
        return lambda obj: tuple(resolve(obj, path) for path in paths)

    return attrgetter


def make_methodcaller(guard: AttributeGuard) -> Callable[..., Callable[[object], object]]:
    def methodcaller(name: object, /, *args: Any, **kwargs: Any) -> Callable[[object], object]:
        checked = _check_name(name)
        if "." in checked:
            raise GuardError(f"method name '{checked}' may not contain dots")
        return lambda obj: guard.attr_by_name(obj, checked)(*args, **kwargs)  # type: ignore[operator]

    return methodcaller


def _default_names(names: Iterable[str], defaults: tuple[str, ...], arg: str) -> tuple[str, ...]:
    chosen = tuple(exact_str(name, "attribute name") for name in names)
    extra = [name for name in chosen if name not in defaults]
    if extra:
        raise GuardError(
            f"attribute '{extra[0]}' may not be reached by name"
            f" (functools {arg}= may only list the default attributes)"
        )
    return chosen


def _check_wrapped(wrapped: object) -> None:
    """update_wrapper copies ``__dict__`` and more from ``wrapped``: a module's globals or a
    library class's private attributes would land in an object the session may read freely."""
    if is_module(wrapped):
        raise GuardError("attributes of a module may not be reached by name (update_wrapper)")
    if issubclass(type(wrapped), type) and not is_session_class(wrapped):  # type: ignore[arg-type]
        raise GuardError(
            "attributes of a class not defined in this session may not be reached by name"
            " (update_wrapper)"
        )


def make_update_wrapper(guard: AttributeGuard) -> Callable[..., object]:
    def update_wrapper(
        wrapper: object,
        wrapped: object,
        assigned: Iterable[str] = functools.WRAPPER_ASSIGNMENTS,
        updated: Iterable[str] = functools.WRAPPER_UPDATES,
    ) -> object:
        chosen = _default_names(assigned, functools.WRAPPER_ASSIGNMENTS, "assigned")
        merged = _default_names(updated, functools.WRAPPER_UPDATES, "updated")
        guard.target(wrapper)
        _check_wrapped(wrapped)
        target: Any = wrapper
        source: Any = wrapped
        return functools.update_wrapper(target, source, chosen, merged)

    return update_wrapper


def make_wraps(update_wrapper: Callable[..., object]) -> Callable[..., object]:
    def wraps(
        wrapped: object,
        assigned: Iterable[str] = functools.WRAPPER_ASSIGNMENTS,
        updated: Iterable[str] = functools.WRAPPER_UPDATES,
    ) -> object:
        chosen = _default_names(assigned, functools.WRAPPER_ASSIGNMENTS, "assigned")
        merged = _default_names(updated, functools.WRAPPER_UPDATES, "updated")
        _check_wrapped(wrapped)
        return functools.partial(update_wrapper, wrapped=wrapped, assigned=chosen, updated=merged)

    return wraps


def _global_enum(cls: type, update_str: bool = False) -> type:
    """enum.global_enum writes members into the globals of the module ``cls.__module__`` names:
    only ours. It reads that name again, so the metaclass must be the standard one too (no
    ``__module__`` property on it to answer differently)."""
    if (
        not issubclass(type(cls), type)
        or not is_session_class(cls)
        or not has_standard_metaclass(cls)
    ):
        raise GuardError(
            "enum.global_enum sets names in the enum's module: attributes of a module cannot be"
            " set or deleted, unless the enum was defined in this session"
        )
    return enum.global_enum(cls, update_str)


def _forbidden_stub(name: str) -> Callable[..., object]:
    def forbidden(*args: object, **kwargs: object) -> object:
        raise GuardError(f"builtin '{name}' is forbidden by the policy")

    forbidden.__name__ = name
    return forbidden


def guarded_builtins(guard: AttributeGuard) -> dict[str, Callable[..., Any]]:
    """getattr, setattr, delattr, vars and dir that refuse dunder and private names."""

    def guarded_getattr(obj: object, name: object, default: object = _MISSING) -> object:
        try:
            return guard.attr_by_name(obj, name)
        except AttributeError:
            if default is _MISSING:
                raise
            return default

    def guarded_vars(*args: object) -> dict[str, object]:
        if len(args) != 1:
            raise GuardError("vars() needs exactly one argument in restricted mode")
        (obj,) = args
        if is_module(obj):
            raise GuardError("vars() of a module is not allowed")
        names = vars(obj)
        return {
            key: guard.screen(value, "vars()")
            for key, value in names.items()
            if type(key) is str and not key.startswith("_")
        }

    def guarded_dir(*args: object) -> list[str]:
        if len(args) != 1:
            raise GuardError("dir() needs exactly one argument in restricted mode")
        if is_module(args[0]):
            guard.modules.require_module(args[0], "dir()")  # type: ignore[arg-type]
        return [name for name in dir(args[0]) if not name.startswith("_")]

    return {
        "getattr": guarded_getattr,
        "setattr": guard.setattr_by_name,
        "delattr": guard.delattr_by_name,
        "vars": guarded_vars,
        "dir": guarded_dir,
    }


def install_replacements(
    guard: AttributeGuard, forbidden_builtins: frozenset[str], import_hook: object
) -> dict[str, object]:
    """Register every stand-in with the guard; return the builtins restricted code gets."""
    formats = FormatMethods(guard)
    guard.format_binder = formats.bind
    update_wrapper = make_update_wrapper(guard)
    stand_ins: list[tuple[object, object]] = [
        (str.format, formats.format),
        (str.format_map, formats.format_map),
        (operator.attrgetter, make_attrgetter(guard)),
        (operator.methodcaller, make_methodcaller(guard)),
        (functools.update_wrapper, update_wrapper),
        (functools.wraps, make_wraps(update_wrapper)),
        (builtins.__import__, import_hook),
    ]
    if hasattr(enum, "global_enum"):
        stand_ins.append((enum.global_enum, _global_enum))
    safe: dict[str, object] = {"__build_class__": builtins.__build_class__}
    for name, value in vars(builtins).items():
        if name == "__import__":
            continue
        if name in forbidden_builtins:
            stand_ins.append((value, _forbidden_stub(name)))
        elif not name.startswith("__"):
            safe[name] = value
    for name, guarded in guarded_builtins(guard).items():
        stand_ins.append((getattr(builtins, name), guarded))
        if name in safe:
            safe[name] = guarded
    for original, replacement in stand_ins:
        guard.replacements.add(original, replacement)
    return safe
