"""Run-time guards for restricted mode: what static analysis cannot see.

The AST transform routes every attribute load through :meth:`AttributeGuard.attr`, every
attribute store or delete through :meth:`AttributeGuard.target`. The guard refuses:
- modules outside the allowlist, as the object read from or as the value read;
- frames, code objects and tracebacks as values, and the attributes that lead to them;
- private (``_``) attributes of modules, and private attributes defined outside user code
  (``Enum._convert_`` reads any module's globals);
- writes to modules, to classes and functions the session did not define, and to objects whose
  attributes library code pastes into source (``dataclasses.Field``);
and swaps known-dangerous callables (``str.format``, ``operator.attrgetter``...) for guarded ones.

Nothing here trusts a user object to describe itself: names are plain ``str`` copies (see
:func:`rules.exact_str`), kinds come from ``type()`` and ``issubclass`` on the real type (an
``isinstance`` can be answered by a ``__class__`` property), and class attributes are read from
the class dictionaries along the MRO, never through a lookup hook.
"""

import abc
import enum
import functools
import operator
import typing
from collections.abc import Callable
from dataclasses import Field
from types import CodeType, FrameType, FunctionType, ModuleType, SimpleNamespace, TracebackType
from typing import Any

from .errors import GuardError
from .modpolicy import ModulePolicy
from .rules import (
    DEFINABLE_DUNDER_METHODS,
    INTERNAL_ATTRS,
    READABLE_DUNDER_ATTRS,
    WRITABLE_DUNDER_ATTRS,
    exact_str,
    is_dunder,
)

USER_MODULE = "__main__"
_INTERNALS = (FrameType, CodeType, TracebackType)
# Values that need a closer look: internals, and the kinds of object a replacement may stand for.
_SCREENED = frozenset(
    {
        *_INTERNALS,
        type,
        type(len),
        type(str.format),
        type(lambda: None),
    }
)
_BUILTIN_METHOD = type(len)
_FORMAT_METHODS = frozenset({"format", "format_map"})
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_NAME = type.__dict__["__name__"]
_TYPE_FLAGS = type.__dict__["__flags__"]
_FUNCTION_GLOBALS = FunctionType.__dict__["__globals__"]
# Py_TPFLAGS_MATCH_SELF: ``case int(x)`` binds the subject itself and reads no attribute.
_MATCH_SELF = 1 << 22
_MISSING: Any = object()
# Objects whose attributes library code pastes into generated source or trusts: a cell may read
# them, never write them (dataclasses reads Field.name again after user code ran; the guard
# reads an lru_cache wrapper's __wrapped__ to see what it calls).
_READ_ONLY = (Field, type(functools.lru_cache()(len)))
# What a class pattern may not read attributes from: the same objects ``attr`` refuses.
_UNREADABLE_SUBJECTS = (ModuleType, super, *_INTERNALS)
# Metaclasses whose lookups and instance checks are the standard ones.
_TRUSTED_METACLASSES = tuple(
    meta
    for meta in (type, abc.ABCMeta, enum.EnumType, getattr(typing, "_ProtocolMeta", None))
    if meta is not None
)


def has_standard_metaclass(cls: type) -> bool:
    """By identity: ``in`` would ask a meta-metaclass's ``__eq__`` and ``__hash__``."""
    meta = type(cls)
    return any(meta is trusted for trusted in _TRUSTED_METACLASSES)


# Stand-ins kept for class patterns; a small cache, checked against the class on every use.
_MAX_PATTERN_PROXIES = 256
_AUG_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.iadd,
    "Sub": operator.isub,
    "Mult": operator.imul,
    "MatMult": operator.imatmul,
    "Div": operator.itruediv,
    "FloorDiv": operator.ifloordiv,
    "Mod": operator.imod,
    "Pow": operator.ipow,
    "LShift": operator.ilshift,
    "RShift": operator.irshift,
    "BitOr": operator.ior,
    "BitXor": operator.ixor,
    "BitAnd": operator.iand,
}


class Replacements:
    """Originals mapped to their guarded stand-ins, by identity."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[object, object]] = {}

    def add(self, original: object, replacement: object) -> None:
        self._by_id[id(original)] = (original, replacement)

    def get(self, value: object) -> object | None:
        entry = self._by_id.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None


def is_session_class(cls: type) -> bool:
    """True for a class a cell defined: its ``__module__`` is the plain string ``__main__``. A
    class can claim another module (that only makes it look like a library class, which may do
    less); a lying str cannot claim this one."""
    module = _TYPE_MODULE.__get__(cls, type)
    return type(module) is str and module == USER_MODULE


def is_module(value: object) -> bool:
    return issubclass(type(value), ModuleType)


def raw_class_attr(cls: type, name: str, default: object) -> object:
    """``name`` as the class dictionaries along ``cls``'s MRO hold it, no hook run, or
    ``default``."""
    for owner in _TYPE_MRO.__get__(cls, type):
        namespace = _TYPE_DICT.__get__(owner, type)
        if name in namespace:
            return namespace[name]
    return default


def _defining_class(obj: object, name: str) -> type | None:
    """The class whose dictionary holds ``name`` as ``obj`` would find it, without running any
    lookup hook; for an instance attribute, the instance's class."""
    owners: tuple[type, ...]
    if type(obj) is super:
        bound: Any = obj
        start, thisclass = bound.__self_class__, bound.__thisclass__
        mro = _TYPE_MRO.__get__(start, type) if issubclass(type(start), type) else ()
        owners = mro[mro.index(thisclass) + 1 :] if thisclass in mro else mro
    elif issubclass(type(obj), type):
        owners = (*_TYPE_MRO.__get__(obj, type), *_TYPE_MRO.__get__(type(obj), type))
    else:
        try:
            instance_dict = object.__getattribute__(obj, "__dict__")
        except (AttributeError, TypeError):
            instance_dict = None
        if type(instance_dict) is dict and name in instance_dict:
            return type(obj)
        owners = _TYPE_MRO.__get__(type(obj), type)
    for owner in owners:
        if name in _TYPE_DICT.__get__(owner, type):
            return owner
    return None


class _PatternType(type):
    """Metaclass of the stand-in a class pattern matches against: the subject is checked like
    the object of an attribute read, then matched against the real class."""

    def __instancecheck__(cls, subject: object) -> bool:
        kind = type(subject)
        if issubclass(kind, _UNREADABLE_SUBJECTS):
            raise GuardError(f"class patterns cannot read attributes of {kind.__name__} objects")
        target: type = _TYPE_DICT.__get__(cls, type)["_target"]
        return isinstance(subject, target)


class AttributeGuard:
    """The checks behind every attribute access of restricted code."""

    def __init__(self, modules: ModulePolicy, namespace: dict[str, Any] | None = None) -> None:
        self.modules = modules
        # The session namespace: functions whose globals it is were defined by cells.
        self.namespace: dict[str, Any] = namespace if namespace is not None else {}
        self.replacements = Replacements()
        # Binds a guarded str.format / str.format_map to a string; set by safe_callables.
        self.format_binder: Callable[[str, str], object] | None = None
        self._patterns: dict[int, tuple[type, tuple[str, ...], type]] = {}

    def attr(self, obj: object, name: str) -> object:
        """``obj.name`` as restricted code may see it."""
        if type(name) is not str:
            name = exact_str(name, "attribute name")
        if name[:1] == "_" or name in INTERNAL_ATTRS:
            self._check_name(obj, name)
        if is_module(obj):
            self.modules.require_module(obj, f"'.{name}'")  # type: ignore[arg-type]
        elif type(obj) is super and is_module(getattr(obj, "__self__", None)):
            raise GuardError("super() over a module is not allowed")
        value = getattr(obj, name)
        if type(value) in _SCREENED or is_module(value):
            return self.screen(value, f"'.{name}'")
        return value

    def attr_by_name(self, obj: object, name: object) -> object:
        """An attribute named by a string built at run time: stricter, no private names."""
        checked = exact_str(name, "attribute name")
        if not checked or checked[0] == "_" or checked in INTERNAL_ATTRS:
            raise GuardError(f"attribute '{checked}' may not be reached by name")
        return self.attr(obj, checked)

    def _check_name(self, obj: object, name: str) -> None:
        if name in INTERNAL_ATTRS:
            raise GuardError(f"attribute '{name}' leads to interpreter internals")
        if is_dunder(name):
            if name in READABLE_DUNDER_ATTRS:
                return
            if type(obj) is super and name in DEFINABLE_DUNDER_METHODS:
                return
            raise GuardError(f"dunder attribute '{name}' is not allowed")
        if is_module(obj):
            raise GuardError(f"private attribute '{name}' of a module is not allowed")
        owner = _defining_class(obj, name)
        if owner is None or not is_session_class(owner):
            raise GuardError(f"private attribute '{name}' not defined in this session")

    def screen(self, value: object, how: str) -> object:
        """Refuse or replace a value restricted code is about to receive."""
        kind = type(value)
        if issubclass(kind, ModuleType):
            self.modules.require_module(value, how)  # type: ignore[arg-type]
            return value
        if issubclass(kind, _INTERNALS):
            raise GuardError(f"{kind.__name__} objects are not available ({how})")
        if kind is _BUILTIN_METHOD and getattr(value, "__name__", "") in _FORMAT_METHODS:
            owner = getattr(value, "__self__", None)
            if isinstance(owner, str):
                if self.format_binder is None:
                    raise GuardError("str.format is not available")
                return self.format_binder(exact_str(owner), getattr(value, "__name__", ""))
        replacement = self.replacements.get(value)
        return value if replacement is None else replacement

    def is_session_function(self, value: object) -> bool:
        """True for a function a cell defined (its globals are the session's)."""
        return type(value) is FunctionType and _FUNCTION_GLOBALS.__get__(value) is self.namespace

    def target(self, obj: object) -> object:
        """The object of ``obj.x = ...`` or ``del obj.x``, once allowed."""
        kind = type(obj)
        if issubclass(kind, ModuleType):
            raise GuardError("attributes of modules cannot be set or deleted")
        if issubclass(kind, type):
            if not is_session_class(obj):  # type: ignore[arg-type]
                name = exact_str(_TYPE_NAME.__get__(obj, type))
                raise GuardError(f"attributes of class '{name}' cannot be set or deleted")
        elif issubclass(kind, super):
            raise GuardError("attributes cannot be set through super()")
        elif kind is FunctionType and not self.is_session_function(obj):
            raise GuardError(
                "attributes of a function not defined in this session cannot be set or deleted"
            )
        elif issubclass(kind, _READ_ONLY):
            raise GuardError(f"attributes of {kind.__name__} objects cannot be set or deleted")
        return obj

    def match_class(self, cls: object, positional: int) -> object:
        """The class of ``case cls(...)`` with sub-patterns. The interpreter reads the subject's
        attributes without any hook, and reads ``__match_args__`` again after this check; so
        the pattern gets a stand-in whose ``__match_args__`` is the copy checked here and whose
        instance check refuses subjects ``attr`` would refuse (modules, frames...)."""
        if not issubclass(type(cls), type):
            return cls  # the interpreter raises TypeError itself
        klass: type = cls  # type: ignore[assignment]
        shown = exact_str(_TYPE_NAME.__get__(klass, type))
        if raw_class_attr(type(klass), "__match_args__", _MISSING) is not _MISSING:
            # The interpreter would take the metaclass's answer, a property can give another.
            raise GuardError(f"class pattern on '{shown}': its metaclass defines __match_args__")
        names: tuple[str, ...] = ()
        found = raw_class_attr(klass, "__match_args__", _MISSING) if positional else _MISSING
        if positional and found is _MISSING and _TYPE_FLAGS.__get__(klass, type) & _MATCH_SELF:
            # int(x), str(x)...: the subject itself is bound, no attribute is read by position.
            if not has_standard_metaclass(klass):
                raise GuardError("class patterns need a class with a standard metaclass")
            return klass
        if found is not _MISSING:
            if type(found) is not tuple or not all(
                type(name) is str and name[:1] != "_" and name not in INTERNAL_ATTRS
                for name in found[:positional]
            ):
                raise GuardError(
                    f"__match_args__ of '{shown}' must be a tuple of public attribute names"
                )
            names = found[:positional]
        return self._pattern_proxy(klass, shown, names)

    def _pattern_proxy(self, cls: type, shown: str, names: tuple[str, ...]) -> type:
        entry = self._patterns.get(id(cls))
        if entry is not None and entry[0] is cls and entry[1] == names:
            return entry[2]
        proxy = _PatternType(shown, (), {"__match_args__": names, "_target": cls})
        if len(self._patterns) >= _MAX_PATTERN_PROXIES:
            self._patterns.clear()
        self._patterns[id(cls)] = (cls, names, proxy)
        return proxy

    def captured(self, value: object) -> object:
        """A value a class pattern bound, screened as ``attr`` would screen it."""
        if type(value) in _SCREENED or is_module(value):
            return self.screen(value, "a class pattern")
        return value

    def augmented(self, obj: object, name: str, op: str, value: object) -> None:
        """``obj.name <op>= value``."""
        self.target(obj)
        result = _AUG_OPS[op](self.attr(obj, name), value)
        setattr(obj, name, result)

    def setattr_by_name(self, obj: object, name: object, value: object) -> None:
        setattr(obj, self._check_writable(obj, name), value)

    def delattr_by_name(self, obj: object, name: object) -> None:
        delattr(obj, self._check_writable(obj, name))

    def _check_writable(self, obj: object, name: object) -> str:
        checked = exact_str(name, "attribute name")
        if not checked or checked[0] == "_" or checked in INTERNAL_ATTRS:
            raise GuardError(f"attribute '{checked}' may not be set or deleted by name")
        self.target(obj)
        return checked

    def check_state_name(self, name: object) -> str:
        """A name an attribute is set under on a caller's behalf (``copy`` applying a state):
        the names a cell could write itself."""
        checked = exact_str(name, "attribute name")
        if checked in INTERNAL_ATTRS or (
            is_dunder(checked) and checked not in WRITABLE_DUNDER_ATTRS
        ):
            raise GuardError(f"attribute '{checked}' may not be set or deleted by name")
        return checked


def match_values(*values: object) -> SimpleNamespace:
    """Holder for the dotted names of a ``match`` statement's patterns, read once, guarded."""
    return SimpleNamespace(**{f"v{index}": value for index, value in enumerate(values)})
