"""Which modules restricted code may reach. Names are checked in full: ``a.b`` needs ``a`` and
``a.b`` in the allowlist, and nothing on its path may be forbidden. Every name is taken as a
plain ``str`` first: the answers are cached, and a cache keyed by a str subclass that lies
about its hash or equality would hand its answer to another name."""

from types import ModuleType
from typing import Any

from .errors import ImportBlockedError
from .rules import exact_str

# The dictionary of a module object, read without any lookup hook.
_MODULE_DICT: Any = vars(ModuleType)["__dict__"]

# A compile-time directive, not a module anyone reaches through.
FUTURE = "__future__"
# Libraries restricted mode does not take, whatever a policy lists: each has routes no static
# rule or guard here closes (numpy.load with allow_pickle, numpy.ctypeslib, numpy.f2py and
# numpy.fromfile; pandas.read_pickle, pandas.eval and DataFrame.query with the python engine,
# readers of any path; matplotlib backends that start processes). Data work runs with
# unrestricted Python, where the container is the boundary: the python-data policy.
DATA_LIBRARIES = frozenset({"numpy", "pandas", "scipy", "matplotlib", "PIL", "sklearn"})
DATA_LIBRARY_REFUSAL = (
    "module '{name}' is not available in restricted mode (its pickle, file and eval routes "
    "cannot be closed here); use the python-data policy, where the container is the boundary"
)


class ModulePolicy:
    """The allow and deny lists of one policy, with every answer cached."""

    def __init__(self, allowed: frozenset[str], forbidden: frozenset[str]) -> None:
        self._allowed = allowed
        self._forbidden = forbidden
        self._answers: dict[str, str | None] = {FUTURE: None}

    def refusal(self, name: str) -> str | None:
        """Why ``name`` may not be imported, or None when it may."""
        if type(name) is not str:
            name = exact_str(name, "module name")
        try:
            return self._answers[name]
        except KeyError:
            pass
        answer = self._judge(name)
        if len(self._answers) < 4096:
            self._answers[name] = answer
        return answer

    def _judge(self, name: str) -> str | None:
        if not name or name.startswith(".") or name.endswith(".") or ".." in name:
            return f"'{name}' is not a module name"
        parts = name.split(".")
        if parts[0] in DATA_LIBRARIES:
            return DATA_LIBRARY_REFUSAL.format(name=parts[0])
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
        for prefix in prefixes:
            if prefix in self._forbidden:
                return f"module '{prefix}' is forbidden by the policy"
        for prefix in prefixes:
            if prefix not in self._allowed:
                return f"module '{prefix}' is not in the allowed modules"
        return None

    def require(self, name: str) -> None:
        """Raise ImportBlockedError unless ``name`` may be imported."""
        name = exact_str(name, "module name")
        reason = self.refusal(name)
        if reason is not None:
            raise ImportBlockedError(f"import of '{name}' is blocked: {reason}", name=name)

    def require_module(self, module: ModuleType, how: str) -> None:
        """Raise ImportBlockedError unless the module object may be used; ``how`` says how it
        was reached, for the message."""
        namespace = _MODULE_DICT.__get__(module, ModuleType)
        name = namespace.get("__name__") if type(namespace) is dict else None
        if type(name) is not str:
            raise ImportBlockedError(f"a module without a name was reached through {how}")
        reason = self.refusal(name)
        if reason is not None:
            raise ImportBlockedError(
                f"module '{name}' reached through {how} is blocked: {reason}", name=name
            )
