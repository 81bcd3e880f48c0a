"""Rich results: what a cell shows besides its text output, as MIME bundles (Jupyter's display
protocol), so a chart comes back as a PNG and a DataFrame as an HTML table.

A bundle is a flat dict: ``text/plain`` always, plus any of ``MIME_TYPES`` the object offers
through ``_repr_mimebundle_`` or the ``_repr_*_`` methods, and the flags ``is_main_result`` (the
value of the cell's final expression) and ``truncated`` (a representation was left out for
size). Binary types travel as base64; ``application/json`` as the JSON value itself.

Bundles come from three places: the final expression, ``display(obj, ...)`` (a builtin while a
cell runs), and matplotlib figures: each one open at the end of the cell, or when the cell calls
``pyplot.show()``, is rendered once to PNG and closed. Every representation is user code; one
that raises or returns the wrong type is left out, as Jupyter does.

All of a cell's bundles share one byte budget (``max_result_bytes``): a representation that does
not fit is dropped, largest first, and its bundle says ``truncated``; ``text/plain`` is cut
rather than dropped, and past ``MAX_RESULTS`` bundles the rest are counted, not kept.
"""

import base64
import binascii
import builtins
import io
import json
import sys
from collections.abc import Callable
from importlib.machinery import PathFinder
from types import ModuleType
from typing import Any

from .introspect import bounded_repr

TEXT = "text/plain"
PNG = "image/png"
JPEG = "image/jpeg"
JSON = "application/json"
# The types a bundle may carry, and the _repr_ method each is asked for, in Jupyter's order.
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    (PNG, "_repr_png_"),
    (JPEG, "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    (JSON, "_repr_json_"),
)
# A table's columns as JSON lists ({column: [values]}): what E2B's ``data`` field holds for a
# DataFrame, made by the worker (no hook of the object's own offers it).
DATA = "application/vnd.sandhold.data+json"
MIME_TYPES = (TEXT, *(mime for mime, _ in REPR_METHODS), DATA)
BINARY_TYPES = frozenset({PNG, JPEG})
# Bundles per cell: a loop that displays a million objects gets a count, not a million bundles.
MAX_RESULTS = 100
_FLAGS = ("is_main_result", "truncated")
_PYPLOT = "matplotlib.pyplot"


class CellResults:
    """The bundles of one cell, within one byte budget."""

    def __init__(self, budget: int, repr_limit: int) -> None:
        self.bundles: list[dict[str, Any]] = []
        self.dropped = 0
        self.truncated = False
        self._budget = budget
        self._repr_limit = repr_limit
        self._shown: set[int] = set()  # ids of figures already rendered in this cell

    def add(self, value: object, *, main: bool = False, plain: str | None = None) -> None:
        """``value``'s bundle; ``plain`` is its repr when the caller already made one."""
        if len(self.bundles) >= MAX_RESULTS:
            self.dropped += 1
            self.truncated = True
            return
        figure = _figure_class()
        if figure is not None and isinstance(value, figure):
            self._shown.add(id(value))
        bundle = self._fit(bundle_of(value, self._repr_limit, plain))
        if main:
            bundle["is_main_result"] = True
        self.bundles.append(bundle)

    def add_bundle(self, bundle: dict[str, Any] | None) -> None:
        """A bundle made already (``display(..., raw=True)``); None is left out."""
        if bundle is None:
            return
        if len(self.bundles) >= MAX_RESULTS:
            self.dropped += 1
            self.truncated = True
            return
        self.bundles.append(self._fit(bundle))

    def add_open_figures(self) -> None:
        """Every pyplot figure still open, rendered once and closed."""
        pyplot: Any = sys.modules.get(_PYPLOT)
        if pyplot is None:
            return
        numbers: list[int] = _call(lambda: list(pyplot.get_fignums())) or []
        for number in numbers:
            figure = _call(lambda number=number: pyplot.figure(number))  # type: ignore[misc]
            if figure is not None and id(figure) not in self._shown:
                self.add(figure)
        _call(lambda: pyplot.close("all"))

    def _fit(self, bundle: dict[str, Any]) -> dict[str, Any]:
        sizes = {mime: _size(value) for mime, value in bundle.items()}
        room = self._budget
        while sum(sizes.values()) > room and len(sizes) > 1:
            largest = max((mime for mime in sizes if mime != TEXT), key=sizes.__getitem__)
            del bundle[largest], sizes[largest]
            bundle["truncated"] = True
        if sizes.get(TEXT, 0) > room:
            bundle[TEXT] = _cut(bundle[TEXT], room)
            sizes[TEXT] = _size(bundle[TEXT])
            bundle["truncated"] = True
        self._budget = max(room - sum(sizes.values()), 0)
        self.truncated = self.truncated or bool(bundle.get("truncated"))
        return bundle


def bundle_of(value: object, repr_limit: int, plain: str | None = None) -> dict[str, Any]:
    """The MIME bundle of ``value``: ``text/plain`` (its own, else ``plain``, else its repr)
    and whatever else it offers."""
    bundle: dict[str, Any] = {}
    figure = _figure_class()
    if figure is not None and isinstance(value, figure):
        png = _figure_png(value)
        if png is not None:
            bundle[PNG] = png
    else:
        bundle.update(_offered(value))
        bundle[DATA] = _checked(DATA, _call(lambda: _table_data(value)))
    text = _checked(TEXT, bundle.get(TEXT))
    if text is None:
        text = plain if plain is not None else _plain(value, repr_limit)
    bundle[TEXT] = text
    return {mime: bundle[mime] for mime in MIME_TYPES if bundle.get(mime) is not None}


def raw_bundle(data: object) -> dict[str, Any] | None:
    """``display(data, raw=True)``: ``data`` is a MIME bundle already; what of it a bundle may
    hold (``text/plain`` empty when it has none), or None for anything but a dict."""
    if not isinstance(data, dict):
        return None
    bundle = {mime: _checked(mime, data.get(mime)) for mime in MIME_TYPES}
    if bundle[TEXT] is None:
        bundle[TEXT] = ""
    return {mime: value for mime, value in bundle.items() if value is not None}


def _table_data(value: object) -> dict[str, Any] | None:
    """A pandas DataFrame's columns as lists, through pandas' own JSON (NaN as null, times as
    epoch milliseconds); None for anything else."""
    pandas = sys.modules.get("pandas")
    frame = getattr(pandas, "DataFrame", None) if pandas is not None else None
    if not isinstance(frame, type) or not isinstance(value, frame):
        return None
    columns: Any = value
    return {
        str(name): json.loads(column.to_json(orient="values")) for name, column in columns.items()
    }


def _offered(value: object) -> dict[str, Any]:
    """What ``value``'s own hooks offer: ``_repr_mimebundle_`` first, then each ``_repr_*_``."""
    found: dict[str, Any] = {}
    hook = _method(value, "_repr_mimebundle_")
    if hook is not None:
        data = _call(lambda: hook(include=None, exclude=None))
        if isinstance(data, tuple) and len(data) == 2:
            data = data[0]  # (data, metadata)
        if isinstance(data, dict):
            for mime in MIME_TYPES:
                checked = _checked(mime, data.get(mime))
                if checked is not None:
                    found[mime] = checked
    for mime, name in REPR_METHODS:
        if mime in found:
            continue
        method = _method(value, name)
        if method is None:
            continue
        data = _call(method)
        if isinstance(data, tuple) and len(data) == 2:
            data = data[0]
        checked = _checked(mime, data)
        if checked is not None:
            found[mime] = checked
    return found


def _method(value: object, name: str) -> Callable[..., Any] | None:
    # Looked up on the type, as Python looks up special methods: a class with __getattr__ that
    # answers every name (a mock, a proxy) does not offer every representation.
    try:
        attribute = getattr(type(value), name, None)
    except Exception:
        return None
    if attribute is None or not callable(attribute):
        return None
    try:
        return getattr(value, name)  # type: ignore[no-any-return]
    except Exception:
        return None


def _call(function: Callable[[], Any]) -> Any:
    try:
        return function()
    except KeyboardInterrupt:
        raise
    except BaseException:  # a representation that fails is left out, even one raising SystemExit
        return None


def _checked(mime: str, data: Any) -> Any:
    """``data`` as it travels for ``mime``, or None when it is not what that type holds."""
    if data is None:
        return None
    if mime in BINARY_TYPES:
        if isinstance(data, bytes | bytearray):
            return base64.b64encode(bytes(data)).decode("ascii")
        if isinstance(data, str):
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                return None
            return data
        return None
    if mime in (JSON, DATA):
        if not isinstance(data, dict | list):
            return None
        try:  # only what survives a round trip through JSON travels as JSON
            return json.loads(json.dumps(data, allow_nan=False))
        except (TypeError, ValueError, RecursionError):
            return None
    return data if type(data) is str else None


def _plain(value: object, repr_limit: int) -> str:
    try:
        return bounded_repr(value, repr_limit)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return f"<{type(value).__name__} object whose repr() failed>"


def _figure_class() -> type | None:
    module = sys.modules.get("matplotlib.figure")
    figure = getattr(module, "Figure", None) if module is not None else None
    return figure if isinstance(figure, type) else None


def _figure_png(figure: Any) -> str | None:
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png")
    except KeyboardInterrupt:
        raise
    except BaseException:
        return None
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogatepass"))
    return len(json.dumps(value))


def _cut(text: str, limit: int) -> str:
    marker = "... [truncated]"
    if limit <= len(marker):
        return ""
    return text[: limit - len(marker)] + marker


class Display:
    """``display()`` and ``pyplot.show()`` for the cell that is running, if any."""

    def __init__(self) -> None:
        self.current: CellResults | None = None

    def display(self, *values: object, raw: bool = False, **options: object) -> None:
        """Show each value as a rich result of the running cell, in order (Jupyter's display);
        with ``raw``, each value is a MIME bundle already. IPython's other options (``include``,
        ``metadata``, ``display_id``...) are taken and ignored."""
        results = self.current
        if results is None:
            return  # a thread still running after its cell ended: nowhere to show it
        for value in values:
            if raw:
                results.add_bundle(raw_bundle(value))
            else:
                results.add(value)

    def show(self, *args: object, **kwargs: object) -> None:
        """``matplotlib.pyplot.show``: the open figures become results of the running cell."""
        results = self.current
        if results is not None:
            results.add_open_figures()

    def show_function(self) -> Any:
        """``show`` as a plain function: pyplot sets ``__signature__`` on its ``show`` when it
        switches backend (the first figure), which a bound method refuses."""

        def show(*args: object, **kwargs: object) -> None:
            self.show(*args, **kwargs)

        return show

    def install(self, namespace_builtins: object) -> None:
        """``display`` among the builtins cells run with, and the pyplot hook."""
        if isinstance(namespace_builtins, dict):
            namespace_builtins["display"] = self.display
        else:
            builtins.display = self.display  # type: ignore[attr-defined]
        pyplot: Any = sys.modules.get(_PYPLOT)
        if pyplot is not None:
            pyplot.show = self.show_function()
        elif not any(isinstance(finder, _PyplotHook) for finder in sys.meta_path):
            sys.meta_path.insert(0, _PyplotHook(self))


class _PyplotHook:
    """Finds ``matplotlib.pyplot`` like the path finder does, and replaces its ``show`` with the
    worker's right after the module runs, so even the cell that first imports it is covered."""

    def __init__(self, display: Display) -> None:
        self._display = display

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _PYPLOT:
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ShowPatchingLoader(spec.loader, self._display)  # type: ignore[assignment]
        return spec


class _ShowPatchingLoader:
    def __init__(self, loader: Any, display: Display) -> None:
        self._loader = loader
        self._display = display

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.show = self._display.show_function()  # type: ignore[attr-defined]
