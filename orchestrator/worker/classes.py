"""The class-body rule of restricted mode, for classes made at run time.

A ``class`` statement is checked before it runs: it may define only the dunder methods of the
ordinary data model (rules.DEFINABLE_DUNDER_METHODS). The same class can be made by a call,
``type(name, bases, namespace)``, a metaclass such as ``abc.ABCMeta``, ``type.__new__`` through
``super()``, ``types.new_class``, ``dataclasses.make_dataclass(namespace=)`` or the functional
API of ``enum``; each is held to the same rule here, on a plain copy of the namespace that is
then the one used, so nothing can change between the check and the class:
- every key is a plain ``str``;
- a dunder key is a definable method bound to a function a cell defined (as ``def`` would
  give), ``__slots__``, ``__match_args__``, ``__hash__`` (None or such a function),
  ``__doc__``, ``__qualname__``, ``__annotations__`` (a plain dict) or ``__module__`` (only
  ``"__main__"``, which is also what a class made here gets when it names none).

Calls are seen where the transform routes them (:meth:`ClassRules.make_callee`): every call with
two to five positional arguments, or with ``*``/``**`` arguments; a class is made by three (a
metaclass) or four (``type.__new__``), and a callable that calls another later is handed it with
at least one more (``functools.partial(type, 'T')``, ``itertools.starmap(type, rows)``). The
callee is looked at first, cheaply: a function a cell defined, a C function, an ordinary class
are called as they are. Otherwise :meth:`ClassRules.call` looks through partial objects and
``lru_cache`` wrappers, holds a metaclass call to the rule, and refuses a metaclass handed to
anything but a function a cell defined or a callable that calls it with one argument
(``map(type, values)``). ``functools.singledispatch`` refuses a metaclass as an implementation
(patches.py). What a class made some other way could do is refused where it would matter
(class patterns, copy, dataclasses, string annotations, class statements): see guards.py and
patches.py.
"""

import abc
import builtins
import enum
import functools
import itertools
import operator
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import GuardError
from .guards import USER_MODULE, AttributeGuard
from .rules import (
    CLASS_NAMESPACE_DUNDER_NAMES,
    DEFINABLE_DUNDER_METHODS,
    exact_str,
    is_dunder,
)

_PARTIAL = functools.partial
_LRU_WRAPPER: type = type(functools.lru_cache()(len))
_METHOD_FUNC = types.MethodType.__dict__["__func__"]
_METHOD_SELF = types.MethodType.__dict__["__self__"]
_STATIC_FUNC = staticmethod.__dict__["__func__"]
_GENERIC_ORIGIN = types.GenericAlias.__dict__["__origin__"]
# Aliases that call their origin when called: ``type[int]``, ``typing.Type[int]``.
_ALIASES: tuple[type, ...] = tuple(
    kind
    for kind in (types.GenericAlias, getattr(typing, "_BaseGenericAlias", None))
    if isinstance(kind, type)
)
_OBJECT_DICT = object.__getattribute__
_PARTIAL_FUNC = functools.partial.__dict__["func"]
_PARTIAL_ARGS = functools.partial.__dict__["args"]
_PARTIAL_KEYWORDS = functools.partial.__dict__["keywords"]
# Deeper partial nests than this are refused rather than looked through.
_MAX_PARTIAL_DEPTH = 32
# type.__new__ and the metaclass __new__ functions of the standard library: called with
# (metaclass, name, bases, namespace) they make a class, whoever calls them.
_TYPE_NEW = type.__new__
_METACLASS_NEWS = tuple(
    getattr(new, "__func__", new)
    for meta in (abc.ABCMeta, enum.EnumType)
    if (new := meta.__dict__.get("__new__")) is not None
)
# Keys the compiler adds to a class statement's namespace, with the kind of value it puts there.
_COMPILER_KEYS: dict[str, type] = {
    "__classcell__": types.CellType,
    "__firstlineno__": int,
    "__static_attributes__": tuple,
}
# What a metaclass, a metaclass's __new__ or a wrapper calling one can be.
_MAKER_KINDS = (
    type,
    types.BuiltinFunctionType,
    types.FunctionType,
    types.MethodType,
    staticmethod,
    _PARTIAL,
    _LRU_WRAPPER,
    *_ALIASES,
)
# The kinds of C method (``str.join``, ``dict.fromkeys``, ``int.__add__``, ``(1).__add__``).
_C_METHODS: tuple[type, ...] = tuple(
    {type(str.join), type(dict.__dict__["fromkeys"]), type(int.__add__), type((1).__add__)}
)
# C callables (and their subclasses) that keep a callable and call it with arguments given
# earlier, or with several: a metaclass handed to them could make a class later.
_GATEWAYS: tuple[type, ...] = (_PARTIAL, _LRU_WRAPPER, map, itertools.starmap)
# Builtins that call what they are given, with several arguments.
_CALLING_BUILTINS = frozenset(
    id(value) for value in (getattr(operator, "call", None),) if value is not None
)
# Callables that call what they are given with a single argument, or not at all.
_UNARY = frozenset(id(value) for value in (map, filter))
_HANDED_ON = (
    "a metaclass may only be called directly, not handed to another callable"
    " (the class-body rule for dunder methods)"
)
# Callables that never call their arguments: a metaclass may be passed to them.
_INERT = frozenset(
    id(value)
    for value in (
        builtins.print,
        builtins.repr,
        builtins.id,
        builtins.hash,
        builtins.isinstance,
        builtins.issubclass,
        tuple,
        list,
        set,
        frozenset,
        dict,
    )
)


def _is_metaclass(value: object) -> bool:
    return issubclass(type(value), type) and issubclass(value, type)  # type: ignore[arg-type]


def _makes_classes(value: object) -> bool:
    """A metaclass, a metaclass's ``__new__``, or a partial object calling one."""
    if not issubclass(type(value), _MAKER_KINDS):
        return False
    target = _unwrap(value)[0]
    return _is_metaclass(target) or _is_metaclass_new(target)


def _is_metaclass_new(value: object) -> bool:
    # By identity: ``in`` would ask the value's own __eq__ and __hash__.
    return value is _TYPE_NEW or any(value is new for new in _METACLASS_NEWS)


class ClassRules:
    """The class-body rule for one session."""

    def __init__(self, guard: AttributeGuard) -> None:
        self._guard = guard

    def check_namespace(self, namespace: object, how: str) -> dict[str, Any]:
        """A plain copy of ``namespace``, refused unless it keeps the class-body rule."""
        if type(namespace) is not dict:
            raise GuardError(f"the namespace given to {how} must be a plain dict")
        checked: dict[str, Any] = {}
        for key, value in namespace.items():
            self._check_entry(key, value, how)
            checked[key] = value
        return checked

    def check_mapping(self, namespace: Mapping[str, object], how: str) -> None:
        """The rule for a namespace that cannot be copied (one a metaclass's ``__prepare__``
        made, such as enum's); it is checked right before the class is made from it."""
        for key in list(namespace.keys()):
            self._check_entry(key, namespace[key], how)

    def _check_entry(self, key: object, value: object, how: str) -> None:
        if type(key) is not str:
            raise GuardError(f"class attribute names given to {how} must be plain strings")
        if not is_dunder(key):
            return
        if key in DEFINABLE_DUNDER_METHODS or key == "__hash__":
            allowed = self._guard.is_session_function(value) or (
                key == "__hash__" and value is None
            )
            if not allowed:
                raise GuardError(
                    f"dunder method '{key}' given to {how} must be a function defined in a cell"
                )
        elif key == "__module__":
            if type(value) is not str or value != USER_MODULE:
                raise GuardError(f"dunder name '__module__' given to {how} must be '__main__'")
        elif key == "__qualname__":
            if type(value) is not str:
                raise GuardError(f"dunder name '__qualname__' given to {how} must be a string")
        elif key == "__annotations__":
            if type(value) is not dict:
                raise GuardError(f"dunder name '__annotations__' given to {how} must be a dict")
        elif key in _COMPILER_KEYS:
            # A class statement's namespace, handed on by a metaclass's __new__: only the kinds
            # of value the compiler puts there (a cell, which no cell can reach otherwise).
            if type(value) is not _COMPILER_KEYS[key]:
                raise GuardError(f"dunder name '{key}' given to {how} is not the compiler's")
        elif key not in CLASS_NAMESPACE_DUNDER_NAMES:
            raise GuardError(f"dunder method '{key}' is not allowed in a class made by {how}")

    def refuse_maker_type(self, data_type: object) -> None:
        """Refuse a type whose instances enum would build from a class body's values when its
        instances are classes or call what they were built with (``class E(type, Enum)``)."""
        if _is_metaclass(data_type) or (
            issubclass(type(data_type), type) and issubclass(data_type, _GATEWAYS)  # type: ignore[arg-type]
        ):
            raise GuardError(_HANDED_ON)

    def refuse_metaclass(self, value: object) -> None:
        """Refuse a metaclass (or a wrapper of one) where it would be kept and called later."""
        if _makes_classes(value):
            raise GuardError(_HANDED_ON)

    def make_callee(self) -> Callable[[object], object]:
        """What a routed call calls: the callable itself when it cannot make a class and calls
        nothing it is given with several arguments, else :meth:`call` bound to it. Called as it
        is: a Python function (a cell's own calls are guarded; a library's call what they were
        written to call), except a metaclass's ``__new__``; a method of one; a C function or
        method not bound to a metaclass; a class that is neither a metaclass nor one of the
        gateways. It runs before every such call, so it is a closure over what it compares."""
        call = self.call
        function, method, partial = types.FunctionType, types.MethodType, functools.partial
        # Compared by identity below: ``in`` would ask a metaclass's __eq__.
        builtin, wrapper = types.BuiltinFunctionType, types.MethodWrapperType
        unbound_c = _C_METHODS
        calling_builtins, gateways = _CALLING_BUILTINS, _GATEWAYS
        # The metaclass __new__ functions live as long as their modules: their ids are theirs.
        news = frozenset(id(new) for new in _METACLASS_NEWS)

        def callee(func: Any) -> object:
            kind = type(func)
            # Attributes of exact functions and methods are their own: neither is subclassable.
            if kind is function:
                if id(func) not in news:
                    return func
            elif kind is method:
                if type(func.__func__) is function and id(func.__func__) not in news:
                    return func
            elif kind is builtin or kind is wrapper:
                if id(func) not in calling_builtins and not _is_metaclass(func.__self__):
                    return func
            elif any(kind is c_method for c_method in unbound_c) or (
                issubclass(kind, type)
                and not (issubclass(func, type) or issubclass(func, gateways))
            ):
                return func
            return partial(call, func)

        return callee

    def call(self, func: object, /, *args: Any, **kwargs: Any) -> object:
        """``func(*args, **kwargs)`` for a call that could make a class."""
        target, bound, bound_keywords = _unwrap(func)
        positional = (*bound, *args)
        keywords = {**bound_keywords, **kwargs} if bound_keywords else kwargs
        if _is_metaclass(target) and len(positional) == 3:
            name, bases, namespace = positional
            how = f"{exact_str(type.__dict__['__name__'].__get__(target, type))}()"
            checked = self.check_namespace(namespace, how)
            checked.setdefault("__module__", USER_MODULE)  # made here, it would take ours
            return target(name, bases, checked, **keywords)  # type: ignore[operator]
        if len(positional) == 4 and _is_metaclass_new(target):
            meta, name, bases, namespace = positional
            checked = self.check_namespace(namespace, "type.__new__()")
            checked.setdefault("__module__", USER_MODULE)
            return target(meta, name, bases, checked, **keywords)  # type: ignore[operator]
        unary = id(target) in _UNARY and len(positional) == 2 and not keywords
        if not unary and id(target) not in _INERT and not self._guard.is_session_function(target):
            for value in (*positional, *keywords.values()):
                if _makes_classes(value):
                    raise GuardError(_HANDED_ON)
        return func(*args, **kwargs)  # type: ignore[operator]

    def new_class(
        self,
        name: str,
        bases: Iterable[object] = (),
        kwds: dict[str, Any] | None = None,
        exec_body: Callable[[Any], object] | None = None,
    ) -> type:
        """types.new_class, with the namespace held to the class-body rule."""
        given = tuple(bases)
        resolved = types.resolve_bases(given)
        meta, namespace, keywords = types.prepare_class(name, resolved, kwds)
        if exec_body is not None:
            exec_body(namespace)
        how = "types.new_class()"
        if type(namespace) is dict:
            checked: Any = self.check_namespace(namespace, how)
        else:
            self.check_mapping(namespace, how)
            checked = namespace
        checked.setdefault("__module__", USER_MODULE)
        if resolved is not given:
            checked["__orig_bases__"] = given
        return meta(name, resolved, checked, **keywords)  # type: ignore[no-any-return]

    def enum_names(self, names: object) -> object:
        """The member names and values enum's functional API was given, read once, checked:
        a member named like a dunder becomes a class attribute instead."""
        if isinstance(names, str):
            return exact_str(names)
        if isinstance(names, Mapping):
            items: list[Any] = [(key, names[key]) for key in list(names.keys())]
        else:
            items = list(names)  # type: ignore[call-overload]
        checked: list[object] = []
        for item in items:
            if isinstance(item, str):
                checked.append(self._enum_name(item))
            else:
                name, value = item
                checked.append((self._enum_name(name), value))
        return checked

    def _enum_name(self, name: object) -> str:
        plain = exact_str(name, "enum member name")
        if is_dunder(plain):
            raise GuardError(f"dunder method '{plain}' is not allowed in a class made by enum")
        return plain


def _alias_origin(alias: object) -> object:
    if issubclass(type(alias), types.GenericAlias):
        return _GENERIC_ORIGIN.__get__(alias)
    try:
        return object.__getattribute__(alias, "__origin__")
    except AttributeError:
        return None


def _unwrap(func: object) -> tuple[object, tuple[object, ...], dict[str, Any]]:
    """The callable a partial object or an ``lru_cache`` wrapper calls, with the arguments a
    partial adds, read from their slots and dictionaries (a cell cannot write an lru_cache
    wrapper's, see guards.py)."""
    args: tuple[object, ...] = ()
    keywords: dict[str, Any] = {}
    target = func
    for _ in range(_MAX_PARTIAL_DEPTH):
        kind = type(target)
        if issubclass(kind, _PARTIAL):
            args = (*_PARTIAL_ARGS.__get__(target), *args)
            keywords = {**_PARTIAL_KEYWORDS.__get__(target), **keywords}
            target = _PARTIAL_FUNC.__get__(target)
        elif kind is _LRU_WRAPPER:
            target = _OBJECT_DICT(target, "__dict__").get("__wrapped__")
        elif kind is types.MethodType:
            args = (_METHOD_SELF.__get__(target), *args)
            target = _METHOD_FUNC.__get__(target)
        elif issubclass(kind, staticmethod):
            target = _STATIC_FUNC.__get__(target)
        elif issubclass(kind, _ALIASES):
            target = _alias_origin(target)  # list[int](...), typing.Type[int](...) call it
        elif kind is types.MethodWrapperType and _is_metaclass(getattr(target, "__self__", None)):
            if getattr(target, "__name__", None) != "__call__":
                return target, args, keywords
            target = getattr(target, "__self__", None)  # a metaclass's __call__: the metaclass
        else:
            return target, args, keywords
    raise GuardError("partial objects nested this deep cannot be called")
