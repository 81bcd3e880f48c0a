"""Names the restricted mode treats specially. The static validator and the runtime guards share
these sets so that what one allows the other allows too."""

import types

# type's own __module__ getter: what a class says through it cannot be overridden by a metaclass.
_TYPE_MODULE = type.__dict__["__module__"]
# str's own __str__: for a str subclass it returns a plain copy of the characters, whatever
# methods the subclass overrides.
_PLAIN_STR = str.__str__


def class_module(cls: type) -> object:
    """``cls.__module__`` as type stores it. Here rather than in guards.py so that introspect.py,
    which every worker imports, does not pull in the restricted mode's guards."""
    return _TYPE_MODULE.__get__(cls, type)


def exact_str(value: object, what: str = "name") -> str:
    """``value`` as a plain ``str``. A subclass can answer ``startswith``, ``[0]``, ``==`` or
    ``hash`` as it likes while C code uses its characters; every check must therefore run on a
    plain copy, and the copy is what is used afterwards."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return _PLAIN_STR(value)  # a TypeError if isinstance lied
    raise TypeError(f"{what} must be a string, not {type(value).__name__}")


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


# Special methods a class body may define: the data model ordinary classes use. Every hook that
# intercepts attribute lookup, class creation, pickling or finalisation is left out on purpose.
_ARITHMETIC = [
    "add",
    "sub",
    "mul",
    "matmul",
    "truediv",
    "floordiv",
    "mod",
    "divmod",
    "pow",
    "lshift",
    "rshift",
    "and",
    "xor",
    "or",
]
DEFINABLE_DUNDER_METHODS = frozenset(
    [f"__{op}__" for op in _ARITHMETIC]
    + [f"__r{op}__" for op in _ARITHMETIC]
    + [f"__i{op}__" for op in _ARITHMETIC if op != "divmod"]
    + [
        f"__{name}__"
        for name in [
            "init",
            "new",
            "post_init",
            "repr",
            "str",
            "format",
            "bytes",
            "hash",
            "bool",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "len",
            "length_hint",
            "iter",
            "next",
            "reversed",
            "contains",
            "getitem",
            "setitem",
            "delitem",
            "missing",
            "call",
            "enter",
            "exit",
            "aenter",
            "aexit",
            "aiter",
            "anext",
            "await",
            "get",
            "set",
            "delete",
            "neg",
            "pos",
            "abs",
            "invert",
            "complex",
            "int",
            "float",
            "index",
            "round",
            "trunc",
            "floor",
            "ceil",
            "copy",
            "deepcopy",
        ]
    ]
)

# Dunder attributes that are plain strings: reading them reveals nothing and reaches nothing.
READABLE_DUNDER_ATTRS = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})
# ...and the ones a decorator commonly copies onto its wrapper.
WRITABLE_DUNDER_ATTRS = frozenset({"__name__", "__qualname__", "__doc__"})
# Dunder names a cell may read (``if __name__ == "__main__":``).
READABLE_DUNDER_NAMES = frozenset({"__name__", "__debug__"})
# Dunder names a class body may assign (``__slots__ = ...``, ``__hash__ = None``,
# ``__match_args__ = ('x', 'y')``: class patterns read it once, raw, and check the names).
CLASS_BODY_DUNDER_NAMES = frozenset({"__slots__", "__hash__", "__match_args__"})
# Dunder keys a class namespace built at run time (``type(name, bases, ns)``, ``types.new_class``,
# ``make_dataclass(namespace=)``) may hold besides the definable methods: what the compiler
# itself puts in a class body's namespace.
CLASS_NAMESPACE_DUNDER_NAMES = frozenset(
    {*CLASS_BODY_DUNDER_NAMES, "__module__", "__qualname__", "__doc__", "__annotations__"}
)

# Decorators allowed as bare names, as dotted module paths, and as ``@<name>.<method>``.
DECORATOR_NAMES = frozenset(
    {
        "property",
        "staticmethod",
        "classmethod",
        "dataclass",
        "wraps",
        "lru_cache",
        "cache",
        "cached_property",
        "total_ordering",
        "singledispatch",
        "singledispatchmethod",
        "abstractmethod",
        "unique",
        "overload",
        "final",
        "runtime_checkable",
    }
)
DECORATOR_PATHS = frozenset(
    {
        "dataclasses.dataclass",
        "functools.wraps",
        "functools.lru_cache",
        "functools.cache",
        "functools.cached_property",
        "functools.total_ordering",
        "functools.singledispatch",
        "functools.singledispatchmethod",
        "abc.abstractmethod",
        "enum.unique",
        "typing.overload",
        "typing.final",
        "typing.runtime_checkable",
    }
)
DECORATOR_METHODS = frozenset({"setter", "getter", "deleter", "register"})


def _internal_attrs() -> frozenset[str]:
    """Attributes of frames, tracebacks, code objects, generators and coroutines: each leads to
    a frame, its globals or its code, which is the way out of any in-process sandbox."""
    kinds: dict[type, str] = {
        types.FrameType: "f_",
        types.TracebackType: "tb_",
        types.CodeType: "co_",
        types.GeneratorType: "gi_",
        types.CoroutineType: "cr_",
        types.AsyncGeneratorType: "ag_",
    }
    names = {
        name for kind, prefix in kinds.items() for name in dir(kind) if name.startswith(prefix)
    }
    return frozenset(names | {"gi_frame", "cr_frame", "ag_frame", "tb_frame", "f_globals"})


INTERNAL_ATTRS = _internal_attrs()
