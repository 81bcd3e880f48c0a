"""Process-wide patches for restricted mode, for library code that evaluates strings, makes
classes or sets attributes by name on behalf of user code, whatever path led there:
- ``typing.ForwardRef._evaluate`` and ``typing._eval_type``: string annotations are evaluated
  by typeeval.py, in guarded namespaces, never with ``eval()`` in a module's globals.
- ``string.Formatter.get_field``: field traversal (``{0.attr}``) goes through the guard.
- ``dataclasses._process_class`` and ``_get_field``: field names are pasted into generated
  source code. Only classes a cell defined, with standard metaclasses, pass; the annotations
  are copied once and checked (plain identifiers), base fields must be real ``Field`` objects
  with such names, and a cell cannot rename a ``Field`` later (guards.py makes them read-only).
  A library decorating its own classes while it is imported is left alone.
- ``copy._reconstruct``: the state a ``__reduce__`` result (or an entry of the public
  ``copy.dispatch_table``) asks for is set as a cell's own writes would be: never on modules,
  library classes or library functions, never under a dunder name.
- ``types.new_class`` (and so ``dataclasses.make_dataclass``), but for a library importing
  itself, and enum's functional API keep the class-body rule (classes.py).
- ``functools.singledispatch``: a generic function calls its implementations with the caller's
  arguments, so a metaclass may not be one (``register(str)(type)`` would make classes); enum
  builds members by calling its data type with a class body's values, so that type may not be
  a metaclass or a callable that calls what it is given (``class E(type, Enum)``).
- ``collections.UserString.format`` and ``format_map`` format through the guard, as
  ``str.format`` does for a cell.
The worker installs them once; tests undo them with the callable ``install`` returns."""

import collections
import copy
import dataclasses
import enum
import functools
import keyword
import string
import sys
import types
import typing
from collections.abc import Callable
from types import FrameType
from typing import Any

from .classes import ClassRules
from .errors import GuardError
from .guards import (
    USER_MODULE,
    AttributeGuard,
    has_standard_metaclass,
    is_session_class,
    raw_class_attr,
)
from .rules import exact_str, is_dunder
from .safe_callables import guarded_get_field
from .typeeval import Annotations

_FIELDS = "__dataclass_fields__"
# Library modules a cell's request passes through on its way to a patched function.
_HOPS = frozenset({"dataclasses", "types"})
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]


def check_dataclass(cls: object) -> None:
    """Refuse a class dataclasses would paste unchecked names from; pin its annotations."""
    if not issubclass(type(cls), type):
        return  # dataclasses raises its own error
    klass: type = cls  # type: ignore[assignment]
    if not is_session_class(klass):
        raise GuardError(
            "dataclasses sets methods on the class: attributes of a class not defined in this"
            " session cannot be set or deleted"
        )
    mro = _TYPE_MRO.__get__(klass, type)
    if not all(has_standard_metaclass(base) for base in mro):
        raise GuardError("dataclasses need classes whose metaclass is type, ABCMeta or EnumType")
    own = _TYPE_DICT.__get__(klass, type)
    if "__annotations__" in own:
        annotations = own["__annotations__"]
        if type(annotations) is not dict:
            raise GuardError("dataclass annotations must be a plain dict")
        pinned: dict[str, object] = {}
        for name, value in annotations.items():
            if not _plain_identifier(name):
                raise GuardError(f"dataclass field name {name!r} is not a plain identifier")
            pinned[name] = value
        # dataclasses reads this copy, which no cell holds and so none can change meanwhile.
        type.__setattr__(klass, "__annotations__", pinned)
    for base in mro[1:]:
        fields = raw_class_attr(base, _FIELDS, None)
        if fields is None:
            continue
        if type(fields) is not dict:
            raise GuardError(f"{_FIELDS} of a base class must be a plain dict")
        for field in fields.values():
            if type(field) is not dataclasses.Field or not _plain_identifier(field.name):
                raise GuardError("fields of a dataclass base must be dataclasses.Field objects")


def _plain_identifier(name: object) -> bool:
    return (
        type(name) is str
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not is_dunder(name)
    )


def install(
    guard: AttributeGuard, safe_builtins: dict[str, object], classes: ClassRules
) -> Callable[[], None]:
    """Apply the patches; return a callable that takes them back."""
    undo: list[tuple[type | object, str, object]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        # A class's own entry (a classmethod stays one), else the module attribute.
        found = vars(owner).get(name) if isinstance(owner, type) else None
        original = found if found is not None else getattr(owner, name, None)
        if original is None:
            return  # not in this Python version: nothing to guard
        undo.append((owner, name, original))
        setattr(owner, name, make(original))

    annotations = Annotations(guard, safe_builtins)
    # Resolved at call time, so nested annotations go through the patched function too.
    patch(typing, "_eval_type", annotations.eval_type)
    patch(
        typing.ForwardRef,
        "_evaluate",
        lambda _original: annotations.forward_ref_evaluate(
            lambda *args, **kwargs: typing._eval_type(*args, **kwargs)  # type: ignore[attr-defined]
        ),
    )
    patch(string.Formatter, "get_field", lambda _original: _get_field(guard))
    patch(dataclasses, "_process_class", lambda original: _process_class(guard, original))
    patch(dataclasses, "_get_field", _checked_field)
    patch(copy, "_reconstruct", lambda _original: _reconstruct(guard, classes))
    patch(types, "new_class", lambda original: _new_class(guard, classes, original))
    patch(enum.EnumType, "_create_", lambda original: _enum_create(classes, original))
    patch(functools, "singledispatch", lambda original: _singledispatch(classes, original))
    patch(enum.EnumType, "_find_data_type_", lambda original: _enum_data_type(classes, original))
    patch(collections.UserString, "format", lambda _original: _user_string(guard, "format"))
    patch(collections.UserString, "format_map", lambda _original: _user_string(guard, "format_map"))

    def restore() -> None:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)

    return restore


def _get_field(guard: AttributeGuard) -> Callable[..., tuple[Any, str]]:
    def get_field(
        self: string.Formatter, field_name: str, args: Any, kwargs: Any
    ) -> tuple[Any, str]:
        return guarded_get_field(self, guard, field_name, args, kwargs)

    return get_field


def a_library_importing_itself(guard: AttributeGuard) -> bool:
    """True when the code that called into dataclasses or types (past those modules and the
    worker's own frames) is a module's own code while that module is being imported: a library
    decorating its classes. Anything else (a cell, a library forwarding what a cell handed it,
    as singledispatch or copy do) gets the checks."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        namespace = frame.f_globals
        if namespace is guard.namespace:
            return False
        name = namespace.get("__name__")
        if name not in _HOPS and namespace.get("__package__") != __package__:
            module = sys.modules.get(name) if type(name) is str else None
            spec = getattr(module, "__spec__", None)
            return name != USER_MODULE and getattr(spec, "_initializing", False) is True
        frame = frame.f_back
    return False


def _process_class(guard: AttributeGuard, original: Callable[..., object]) -> Callable[..., object]:
    def process_class(cls: type, *args: Any, **kwargs: Any) -> object:
        if not a_library_importing_itself(guard):
            check_dataclass(cls)
        return original(cls, *args, **kwargs)

    return process_class


def _new_class(
    guard: AttributeGuard, classes: ClassRules, original: Callable[..., type]
) -> Callable[..., type]:
    def new_class(*args: Any, **kwargs: Any) -> type:
        if a_library_importing_itself(guard):
            return original(*args, **kwargs)
        return classes.new_class(*args, **kwargs)

    return new_class


def _checked_field(original: Callable[..., object]) -> Callable[..., object]:
    def get_field(cls: type, a_name: str, *args: Any, **kwargs: Any) -> object:
        field: Any = original(cls, a_name, *args, **kwargs)
        if type(field) is not dataclasses.Field or field.name is not a_name:
            raise GuardError("dataclass field defaults must be plain dataclasses.field() objects")
        return field

    return get_field


def _reconstruct(guard: AttributeGuard, classes: ClassRules) -> Callable[..., object]:
    """copy's rebuilding of an object from a ``__reduce__`` result: the constructor called as a
    cell's call would be, the state set through the guard. The steps are copy's own: build,
    memoize, state, then list and dict items."""

    def reconstruct(
        x: object,
        memo: dict[int, Any] | None,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        state: object = None,
        listiter: Any = None,
        dictiter: Any = None,
        *,
        deepcopy: Callable[..., Any] = copy.deepcopy,
    ) -> object:
        deep = memo is not None
        if deep and args:
            args = deepcopy(args, memo)
        made: Any = classes.call(func, *args)
        if memo is not None:
            memo[id(x)] = made
        if state is not None:
            _set_state(guard, made, deepcopy(state, memo) if deep else state)
        if listiter is not None:
            for item in listiter:
                made.append(deepcopy(item, memo) if deep else item)
        if dictiter is not None:
            for key, value in dictiter:
                if deep:
                    key, value = deepcopy(key, memo), deepcopy(value, memo)
                made[key] = value
        return made

    return reconstruct


def _set_state(guard: AttributeGuard, made: Any, state: Any) -> None:
    guard.target(made)
    if hasattr(made, "__setstate__"):
        made.__setstate__(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state is not None:
        instance_dict = made.__dict__
        for key, value in dict(state).items():
            instance_dict[exact_str(key, "attribute name")] = value
    if slots is not None:
        for key, value in dict(slots).items():
            setattr(made, guard.check_state_name(key), value)


def _caller_module() -> str | None:
    """The module that called enum's functional API, as enum itself would find it, past this
    wrapper and the worker's own frames (a call routed through classes.py)."""
    try:
        frame: FrameType | None = sys._getframe(3)
    except ValueError:
        return None
    while frame is not None and frame.f_globals.get("__package__") == __package__:
        frame = frame.f_back
    return None if frame is None else frame.f_globals.get("__name__")


def _enum_create(classes: ClassRules, original: Callable[..., object]) -> Callable[..., object]:
    def _create_(
        cls: type,
        class_name: object,
        names: object,
        *,
        module: object = None,
        qualname: object = None,
        **kwargs: Any,
    ) -> object:
        return original(
            cls,
            exact_str(class_name, "enum name"),
            classes.enum_names(names),
            module=_caller_module() if module is None else exact_str(module, "module name"),
            qualname=None if qualname is None else exact_str(qualname, "qualified name"),
            **kwargs,
        )

    return _create_


def _singledispatch(classes: ClassRules, original: Callable[..., Any]) -> Callable[..., Any]:
    valid_dispatch_type = getattr(functools, "_is_valid_dispatch_type", None)

    def singledispatch(func: Any) -> Any:
        classes.refuse_metaclass(func)
        generic = original(func)
        register_checked = generic.register

        def register(cls: Any, func: Any = None) -> Any:
            if func is None:
                is_type = valid_dispatch_type(cls) if valid_dispatch_type else isinstance(cls, type)
                if is_type:
                    return lambda implementation: register(cls, implementation)
                classes.refuse_metaclass(cls)  # the annotated-function form
                return register_checked(cls)
            classes.refuse_metaclass(func)
            return register_checked(cls, func)

        generic.register = register
        return generic

    return singledispatch


def _enum_data_type(classes: ClassRules, original: Any) -> Any:
    def _find_data_type_(mcls: type, class_name: str, bases: tuple[type, ...]) -> object:
        found = original.__func__(mcls, class_name, bases)
        classes.refuse_maker_type(found)
        return found

    return classmethod(_find_data_type_)


def _user_string(guard: AttributeGuard, method: str) -> Callable[..., str]:
    def format_method(self: collections.UserString, /, *args: Any, **kwargs: Any) -> str:
        binder = guard.format_binder
        if binder is None:
            raise GuardError("str.format is not available")
        bound: Any = binder(exact_str(self.data), method)
        return bound(*args, **kwargs)  # type: ignore[no-any-return]

    format_method.__name__ = method
    return format_method
