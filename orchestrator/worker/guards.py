"""Run-time guards for restricted mode: what static analysis cannot see.

The AST transform routes every attribute load through :meth:`AttributeGuard.attr`, every
attribute store or delete through :meth:`AttributeGuard.target`. The guard refuses:
- modules outside the allowlist, as the object read from or as the value read;
- frames, code objects and tracebacks as values, and the attributes that lead to them;
- private (``_``) attributes of modules, and private attributes defined outside user code
  (``Enum._convert_`` reads any module's globals);
- writes to modules and to classes the user did not define;
and swaps known-dangerous callables (``str.format``, ``operator.attrgetter``...) for guarded ones.
"""

import operator
from collections.abc import Callable
from types import CodeType, FrameType, ModuleType, SimpleNamespace, TracebackType
from typing import Any

from .errors import GuardError
from .modpolicy import ModulePolicy
from .rules import DEFINABLE_DUNDER_METHODS, INTERNAL_ATTRS, READABLE_DUNDER_ATTRS, is_dunder

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


def class_module(cls: type) -> object:
    return _TYPE_MODULE.__get__(cls, type)


def _defining_class(obj: object, name: str) -> type | None:
    """The class whose dictionary holds ``name`` as ``obj`` would find it, without running any
    lookup hook; for an instance attribute, the instance's class."""
    owners: tuple[type, ...]
    if isinstance(obj, super):
        bound: Any = obj
        start, thisclass = bound.__self_class__, bound.__thisclass__
        mro = _TYPE_MRO.__get__(start, type) if isinstance(start, type) else ()
        owners = mro[mro.index(thisclass) + 1 :] if thisclass in mro else mro
    elif isinstance(obj, type):
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


class AttributeGuard:
    """The checks behind every attribute access of restricted code."""

    def __init__(self, modules: ModulePolicy) -> None:
        self.modules = modules
        self.replacements = Replacements()
        # Binds a guarded str.format / str.format_map to a string; set by safe_callables.
        self.format_binder: Callable[[str, str], object] | None = None

    def attr(self, obj: object, name: str) -> object:
        """``obj.name`` as restricted code may see it."""
        if name[0] == "_" or name in INTERNAL_ATTRS:
            self._check_name(obj, name)
        if isinstance(obj, ModuleType):
            self.modules.require_module(obj, f"'.{name}'")
        elif type(obj) is super and isinstance(getattr(obj, "__self__", None), ModuleType):
            raise GuardError("super() over a module is not allowed")
        value = getattr(obj, name)
        if type(value) in _SCREENED or isinstance(value, ModuleType):
            return self.screen(value, f"'.{name}'")
        return value

    def attr_by_name(self, obj: object, name: object) -> object:
        """An attribute named by a string built at run time: stricter, no private names."""
        if not isinstance(name, str):
            raise TypeError(f"attribute name must be a string, not {type(name).__name__}")
        if not name or name[0] == "_" or name in INTERNAL_ATTRS:
            raise GuardError(f"attribute '{name}' may not be reached by name")
        return self.attr(obj, name)

    def _check_name(self, obj: object, name: str) -> None:
        if name in INTERNAL_ATTRS:
            raise GuardError(f"attribute '{name}' leads to interpreter internals")
        if is_dunder(name):
            if name in READABLE_DUNDER_ATTRS:
                return
            if isinstance(obj, super) and name in DEFINABLE_DUNDER_METHODS:
                return
            raise GuardError(f"dunder attribute '{name}' is not allowed")
        if isinstance(obj, ModuleType):
            raise GuardError(f"private attribute '{name}' of a module is not allowed")
        owner = _defining_class(obj, name)
        if owner is None or class_module(owner) != USER_MODULE:
            raise GuardError(f"private attribute '{name}' not defined in this session")

    def screen(self, value: object, how: str) -> object:
        """Refuse or replace a value restricted code is about to receive."""
        if isinstance(value, ModuleType):
            self.modules.require_module(value, how)
            return value
        if isinstance(value, _INTERNALS):
            raise GuardError(f"{type(value).__name__} objects are not available ({how})")
        if type(value) is _BUILTIN_METHOD and getattr(value, "__name__", "") in _FORMAT_METHODS:
            owner = getattr(value, "__self__", None)
            if isinstance(owner, str):
                if self.format_binder is None:
                    raise GuardError("str.format is not available")
                return self.format_binder(owner, getattr(value, "__name__", ""))
        replacement = self.replacements.get(value)
        return value if replacement is None else replacement

    def target(self, obj: object) -> object:
        """The object of ``obj.x = ...`` or ``del obj.x``, once allowed."""
        if isinstance(obj, ModuleType):
            raise GuardError("attributes of modules cannot be set or deleted")
        if isinstance(obj, type) and class_module(obj) != USER_MODULE:
            raise GuardError(f"attributes of class '{obj.__qualname__}' cannot be set or deleted")
        if isinstance(obj, super):
            raise GuardError("attributes cannot be set through super()")
        return obj

    def match_class(self, cls: object, positional: int) -> object:
        """The class of ``case cls(p1, ...)``: the names its ``__match_args__`` gives are read
        from the subject without any hook, so they must be public and fixed."""
        if not isinstance(cls, type):
            return cls  # the interpreter raises TypeError itself
        if class_module(type(cls)) == USER_MODULE:
            raise GuardError("positional class patterns need a metaclass not defined in a cell")
        names = getattr(cls, "__match_args__", ())
        if type(names) is not tuple or not all(
            type(name) is str and name[:1] != "_" and name not in INTERNAL_ATTRS
            for name in names[:positional]
        ):
            raise GuardError(f"__match_args__ of '{cls.__qualname__}' names private attributes")
        return cls

    def augmented(self, obj: object, name: str, op: str, value: object) -> None:
        """``obj.name <op>= value``."""
        self.target(obj)
        result = _AUG_OPS[op](self.attr(obj, name), value)
        setattr(obj, name, result)

    def setattr_by_name(self, obj: object, name: object, value: object) -> None:
        self._check_writable(obj, name)
        setattr(obj, name, value)  # type: ignore[arg-type]

    def delattr_by_name(self, obj: object, name: object) -> None:
        self._check_writable(obj, name)
        delattr(obj, name)  # type: ignore[arg-type]

    def _check_writable(self, obj: object, name: object) -> None:
        if not isinstance(name, str):
            raise TypeError(f"attribute name must be a string, not {type(name).__name__}")
        if not name or name[0] == "_" or name in INTERNAL_ATTRS:
            raise GuardError(f"attribute '{name}' may not be set or deleted by name")
        self.target(obj)


def match_values(*values: object) -> SimpleNamespace:
    """Holder for the dotted names of a ``match`` statement's patterns, read once, guarded."""
    return SimpleNamespace(**{f"v{index}": value for index, value in enumerate(values)})
