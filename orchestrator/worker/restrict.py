"""Restricted mode: what one policy lets a cell do, in three layers.

1. :meth:`Restrictions.check`: static rules on the tree (validator.py), all violations at once.
2. :meth:`Restrictions.transform`: attribute access, calls that could make a class, and class
   patterns rerouted through the guards (transform.py).
3. :meth:`Restrictions.builtins`: the builtins cells run with: the policy's forbidden builtins
   left out, ``__import__`` replaced by :meth:`Restrictions.import_module`, guarded ``getattr``
   & co., and the guard functions the transformed code calls.

:meth:`Restrictions.install_process_guards` patches library code that evaluates strings, makes
classes or sets attributes for user code (patches.py); the worker calls it once. None of this is
the security boundary: the container is. It blocks the known ways out and says clearly what it
refused.
"""

import ast
import builtins
import sys
from collections.abc import Callable, Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

from . import patches, transform
from .classes import ClassRules
from .errors import ImportBlockedError, RestrictedError
from .guards import AttributeGuard, match_values
from .modpolicy import FUTURE, ModulePolicy
from .rules import exact_str
from .safe_callables import install_replacements
from .validator import Validator, Violation

_real_import = builtins.__import__


class Restrictions:
    """The restricted mode of one policy."""

    def __init__(
        self,
        *,
        allowed_modules: Sequence[str],
        forbidden_modules: Sequence[str],
        forbidden_builtins: Sequence[str],
        namespace: dict[str, Any] | None = None,
    ) -> None:
        self.modules = ModulePolicy(frozenset(allowed_modules), frozenset(forbidden_modules))
        self.guard = AttributeGuard(self.modules, namespace)
        self.classes = ClassRules(self.guard)
        self._validator = Validator(self.modules, frozenset(forbidden_builtins))
        self._builtins = install_replacements(
            self.guard, frozenset(forbidden_builtins), self.import_module
        )
        self._builtins.update(
            {
                "__import__": self.import_module,
                transform.ATTR_GUARD: self.guard.attr,
                transform.TARGET_GUARD: self.guard.target,
                transform.AUG_GUARD: self.guard.augmented,
                transform.MATCH_GUARD: match_values,
                transform.MATCH_CLASS_GUARD: self.guard.match_class,
                transform.CAPTURE_GUARD: self.guard.captured,
                transform.CALL_GUARD: self.classes.make_callee(),
            }
        )

    def check(self, tree: ast.AST) -> list[Violation]:
        return self._validator.check(tree)

    def transform(self, tree: ast.Module) -> None:
        transform.transform(tree)

    def builtins(self) -> dict[str, object]:
        """A fresh copy of the builtins restricted cells run with."""
        return dict(self._builtins)

    def install_process_guards(self) -> Callable[[], None]:
        return patches.install(self.guard, self._builtins, self.classes)

    def import_module(
        self,
        name: str,
        globals: object = None,
        locals: object = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> object:
        """``__import__`` for restricted code: full dotted names checked, ``from`` imports
        answered with a namespace of guarded values."""
        if level != 0:
            raise ImportBlockedError("relative imports are not allowed")
        # One plain copy is checked, imported and looked up: a str subclass is never seen again.
        plain = exact_str(name, "module name")
        self.modules.require(plain)
        top = _real_import(plain, None, None, (), 0)
        if not fromlist:
            return top
        return self._from_import(plain, sys.modules[plain], fromlist)

    def _from_import(self, name: str, module: ModuleType, fromlist: Sequence[str]) -> object:
        values: dict[str, object] = {}
        for given in fromlist:
            item = exact_str(given, "name to import")
            if item == "*":
                values.update(self._star(name, module))
            elif item.startswith("_") and name != FUTURE:
                raise ImportBlockedError(
                    f"importing private name '{item}' from '{name}' is blocked"
                )
            else:
                values[item] = self._from_value(name, module, item)
        return SimpleNamespace(**values)

    def _from_value(self, name: str, module: ModuleType, item: str) -> object:
        if not hasattr(module, item):
            submodule = f"{name}.{item}"
            self.modules.require(submodule)
            try:
                _real_import(submodule, None, None, (), 0)
            except ModuleNotFoundError:
                raise ImportError(f"cannot import name '{item}' from '{name}'", name=name) from None
        try:
            value = getattr(module, item)
        except AttributeError:
            raise ImportError(f"cannot import name '{item}' from '{name}'", name=name) from None
        return self.guard.screen(value, f"'from {name} import {item}'")

    def _star(self, name: str, module: ModuleType) -> dict[str, object]:
        """Public names for ``from m import *``; a blocked value is left out, not fatal."""
        listed = module.__dict__.get("__all__")
        names = listed if isinstance(listed, list | tuple) else list(module.__dict__)
        found: dict[str, object] = {}
        for item in names:
            if type(item) is not str or item.startswith("_") or not hasattr(module, item):
                continue
            try:
                found[item] = self.guard.screen(getattr(module, item), f"'from {name} import *'")
            except RestrictedError:  # a refused value: skip it, the rest still imports
                continue
        return found
