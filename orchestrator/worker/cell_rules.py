"""IPython's rules for a cell that plain ``exec`` does not have, as E2B's interpreter (an IPython
kernel) applies them, so a cell written for it runs here too.

- An indented cell runs: its common leading whitespace is removed first (IPython's
  ``leading_indent``), which an agent pasting a block out of a function relies on.
- ``from IPython.display import display`` (and ``HTML``, ``Markdown``, ``Image``...) imports
  where the real IPython is not installed: a module of the worker's own whose ``display`` is the
  worker's, made when a cell imports it. An installed IPython is never shadowed, and restricted
  mode refuses the import like any module off its list.
"""

import base64
import importlib.abc
import importlib.util
import sys
import textwrap
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["dedent_cell", "install_ipython_display"]


def dedent_cell(code: str) -> str:
    """``code`` without the indentation its first line of code has in common with the rest."""
    for line in code.splitlines():
        if line.strip():
            return textwrap.dedent(code) if line[:1] in (" ", "\t") else code
    return code


class _Shown:
    """An object shown as one representation (IPython.display's ``HTML`` and the rest)."""

    method = ""

    def __init__(self, data: Any = None, **options: Any) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"<IPython.core.display.{type(self).__name__} object>"


def _shown(name: str, method: str) -> type:
    def represent(self: _Shown) -> Any:
        return self.data

    return type(name, (_Shown,), {method: represent, "__module__": "IPython.display"})


class Image(_Shown):
    """``Image(data=bytes)`` or ``Image(filename=...)``: a PNG or JPEG by its magic bytes."""

    def __init__(self, data: Any = None, *, filename: str | None = None, **options: Any) -> None:
        if filename is not None:
            with open(filename, "rb") as file:
                data = file.read()
        if isinstance(data, str):
            data = base64.b64decode(data)
        super().__init__(data)

    def _repr_png_(self) -> bytes | None:
        return self.data if bytes(self.data[:4]) == b"\x89PNG" else None

    def _repr_jpeg_(self) -> bytes | None:
        return self.data if bytes(self.data[:2]) == b"\xff\xd8" else None


class _IPythonStandIn(importlib.abc.Loader):
    """A finder and loader, last on ``sys.meta_path``, for ``IPython`` and ``IPython.display``:
    reached only when no installed IPython answers, and only when a cell imports them, so
    libraries that look for ``sys.modules["IPython"]`` (matplotlib, tqdm) see none until then."""

    def __init__(self, display: Callable[..., None]) -> None:
        self._display = display

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in ("IPython", "IPython.display"):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname == "IPython")

    def create_module(self, spec: Any) -> ModuleType | None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        if module.__name__ == "IPython":
            module.__doc__ = "sandhold's stand-in for IPython's display API"
            # Code that checks IPython's version (matplotlib) takes the current API's path.
            module.version_info = (8, 24, 0)  # type: ignore[attr-defined]
            module.get_ipython = lambda: None  # type: ignore[attr-defined]
            module.display = importlib.import_module("IPython.display")  # type: ignore[attr-defined]
            return
        names = {
            "display": self._display,
            "HTML": _shown("HTML", "_repr_html_"),
            "Markdown": _shown("Markdown", "_repr_markdown_"),
            "SVG": _shown("SVG", "_repr_svg_"),
            "Latex": _shown("Latex", "_repr_latex_"),
            "JSON": _shown("JSON", "_repr_json_"),
            "Image": Image,
        }
        for name, value in names.items():
            setattr(module, name, value)


def install_ipython_display(display: Callable[..., None]) -> None:
    """``IPython.display`` importable through the stand-in, unless IPython is installed."""
    if importlib.util.find_spec("IPython") is None:
        sys.meta_path.append(_IPythonStandIn(display))
