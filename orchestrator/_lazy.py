"""Public names imported on first use (PEP 562), for a package whose ``__init__`` must stay
cheap to import: ``sandhold --help`` and the CLI's quick commands never pay for the modules
behind names they do not touch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: a name in ``exports`` (name -> module)
    is imported from its module on first use and kept in ``namespace`` (the package's
    ``globals()``), so the next use is an ordinary attribute."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
