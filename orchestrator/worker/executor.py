"""Running one cell: source checks, parse, restricted-mode checks and rewrite, compile, run in
the session namespace, and the outcome as data. Errors raised by user code are results, never
exceptions of the worker; the traceback shows only the user's ``<cell-N>`` frames.

Like a REPL, a final expression statement is evaluated on its own and its value's repr reported.
"""

import ast
import builtins
import linecache
from collections import OrderedDict
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

from .config import WorkerConfig
from .display import CellResults, Display
from .errors import GuardError, ImportBlockedError, RestrictedError
from .interrupts import InterruptGate
from .introspect import bounded_repr

if TYPE_CHECKING:
    import traceback

    from .restrict import Restrictions
    from .validator import Violation

CELL_PREFIX = "<cell-"
# Enough for any report; longer violation lists end with a count of the rest.
MAX_VIOLATIONS = 500
MAX_MESSAGE_CHARS = 8_000
# Sources kept for tracebacks of functions defined in earlier cells.
MAX_KEPT_SOURCES = 500
# Compiled cells kept for reuse: a repeated small cell (a poll, a benchmark) skips parse, checks,
# rewrite and compile. The compiled code does not depend on the namespace, so reuse is exact.
_CACHE_ENTRIES = 256
_CACHE_MAX_CHARS = 4096
# error_type values with a meaning of their own: a user exception class of the same name is
# reported under a qualified name so it cannot pose as one of them. A copy of errors.ERROR_TYPES
# (this code runs in the sandbox, stdlib only); tests/unit/test_public_api.py keeps them equal.
RESERVED_ERROR_TYPES = frozenset(
    [
        "invalid_argument",
        "session_not_found",
        "session_lost",
        "validation",
        "import_blocked",
        "timeout",
        "process_crashed",
        "output_limit",
        "quota_exceeded",
        "policy",
        "busy",
        "backend_unavailable",
        "unknown_template",
        "template_not_built",
        "not_supported",
        "storage_full",
        "path_not_found",
        "internal",
    ]
)


class CellOutcome:
    """How a cell ended (a plain class: see config.WorkerConfig for why not a dataclass)."""

    __slots__ = (
        "error_message",
        "error_type",
        "interrupted",
        "result_repr",
        "success",
        "traceback",
        "violations",
    )

    def __init__(
        self,
        success: bool,
        result_repr: str | None = None,
        error_type: str | None = None,
        error_message: str | None = None,
        traceback: str | None = None,
        violations: list[str] | None = None,
        interrupted: bool = False,
    ) -> None:
        self.success = success
        self.result_repr = result_repr
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        self.violations = violations if violations is not None else []
        self.interrupted = interrupted


class CompiledCell:
    __slots__ = ("body", "filename", "last_expression")

    def __init__(self, filename: str, body: CodeType, last_expression: CodeType | None) -> None:
        self.filename = filename
        self.body = body
        self.last_expression = last_expression


def _validation(message: str, violations: list[str] | None = None) -> CellOutcome:
    return CellOutcome(
        False, error_type="validation", error_message=message, violations=violations or []
    )


class Executor:
    """One session namespace and the cells run in it."""

    def __init__(self, config: WorkerConfig, gate: InterruptGate | None = None) -> None:
        self.config = config
        self.gate = gate or InterruptGate()
        self.module = ModuleType("__main__")
        self.namespace: dict[str, Any] = self.module.__dict__
        self.restrictions: Restrictions | None = None
        self._builtins: object = builtins
        if config.restricted:
            # Imported here: the checker, the rewrite and the guards (and the stdlib modules they
            # patch, dataclasses, typing, enum, copy) are ~20 ms of the worker's start that an
            # unrestricted session never uses.
            from . import restrict

            self.restrictions = restrict.Restrictions(
                allowed_modules=sorted(config.allowed_modules),
                forbidden_modules=sorted(config.forbidden_modules),
                forbidden_builtins=sorted(config.forbidden_builtins),
                namespace=self.namespace,
            )
            self._builtins = self.restrictions.builtins()
        self.display = Display()
        self.display.install(self._builtins)
        self._cells = 0
        self._sources: OrderedDict[str, None] = OrderedDict()
        self._compiled: OrderedDict[str, CompiledCell] = OrderedDict()
        self.reset()

    def reset(self) -> None:
        self.namespace.clear()
        self.namespace.update(
            __name__="__main__",
            __doc__=None,
            __package__=None,
            __loader__=None,
            __spec__=None,
            __builtins__=self._builtins,
        )

    def execute(self, code: str) -> CellOutcome:
        compiled = self.compile(code)
        if isinstance(compiled, CellOutcome):
            return compiled
        return self.run(compiled)

    def compile(self, code: str) -> CompiledCell | CellOutcome:
        cached = self._compiled.get(code)
        if cached is not None:
            self._compiled.move_to_end(code)
            self._keep_source(cached.filename, code)
            return cached
        compiled = self._compile_new(code)
        if isinstance(compiled, CompiledCell) and len(code) <= _CACHE_MAX_CHARS:
            self._compiled[code] = compiled
            if len(self._compiled) > _CACHE_ENTRIES:
                self._compiled.popitem(last=False)
        return compiled

    def _compile_new(self, code: str) -> CompiledCell | CellOutcome:
        problem = self._screen_source(code)
        if problem is not None:
            return _validation(problem)
        self._cells += 1
        filename = f"{CELL_PREFIX}{self._cells}>"
        try:
            return self._compile(code, filename)
        except SyntaxError as exc:
            if str(exc.msg).startswith("too many"):  # a parser limit, not a typo
                return _validation(f"code exceeds a parser limit: {exc.msg}")
            return self._failure(exc)
        except (RecursionError, MemoryError, ValueError, OverflowError) as exc:
            return _validation(
                f"code is too deeply nested or too large to compile ({type(exc).__name__})"
            )

    def _screen_source(self, code: str) -> str | None:
        try:
            size = len(code.encode("utf-8"))
        except UnicodeEncodeError:
            return "code is not valid unicode (it holds a lone surrogate)"
        if size > self.config.max_code_bytes:
            return f"code is {size} bytes, more than the limit of {self.config.max_code_bytes}"
        if "\0" in code:
            return "code contains a null byte"
        return None

    def _compile(self, code: str, filename: str) -> CompiledCell | CellOutcome:
        self._keep_source(filename, code)
        tree = ast.parse(code, filename, "exec")
        if self.restrictions is not None:
            found = self.restrictions.check(tree)
            if found:
                return self._rejected(found)
            self.restrictions.transform(tree)
        last: ast.Expression | None = None
        final = tree.body[-1] if tree.body else None
        if isinstance(final, ast.Expr):
            tree.body.pop()
            last = ast.Expression(final.value)
        body = compile(tree, filename, "exec", dont_inherit=True)
        expression = compile(last, filename, "eval", dont_inherit=True) if last else None
        return CompiledCell(filename, body, expression)

    def _rejected(self, found: "list[Violation]") -> CellOutcome:
        texts = [str(violation) for violation in found[:MAX_VIOLATIONS]]
        if len(found) > MAX_VIOLATIONS:
            texts.append(f"... and {len(found) - MAX_VIOLATIONS} more violations")
        imports_only = all(violation.kind == "import_blocked" for violation in found)
        outcome = _validation(
            f"code rejected: {texts[0]}"
            + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""),
            texts,
        )
        if imports_only:
            outcome.error_type = "import_blocked"
        return outcome

    def _keep_source(self, filename: str, code: str) -> None:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        self._sources.pop(filename, None)
        self._sources[filename] = None
        while len(self._sources) > MAX_KEPT_SOURCES:
            old, _ = self._sources.popitem(last=False)
            linecache.cache.pop(old, None)

    def run(self, cell: CompiledCell, results: CellResults | None = None) -> CellOutcome:
        """Run ``cell``; with ``results``, what it displays and its final value go there."""
        try:
            return self.gate.call(lambda: self._run(cell, results))
        except KeyboardInterrupt as exc:  # arrived while leaving user code
            return self._failure(exc)

    def _run(self, cell: CompiledCell, results: CellResults | None) -> CellOutcome:
        self.display.current = results
        try:
            try:
                outcome = self._evaluate(cell, results)
            finally:
                # Figures drawn before an exception are shown too, as in Jupyter; still inside
                # the gate, so an interrupt reaches a figure that takes forever to draw.
                if results is not None:
                    results.add_open_figures()
            return outcome
        except BaseException as exc:
            self.gate.armed = False
            return self._failure(exc)
        finally:
            self.display.current = None

    def _evaluate(self, cell: CompiledCell, results: CellResults | None) -> CellOutcome:
        exec(cell.body, self.namespace)
        if cell.last_expression is None:
            return CellOutcome(True)
        value = eval(cell.last_expression, self.namespace)
        if value is None:
            return CellOutcome(True)
        text = bounded_repr(value, self.config.max_repr_chars)
        if results is not None:
            results.add(value, main=True, plain=text)
        return CellOutcome(True, result_repr=text)

    def _failure(self, exc: BaseException) -> CellOutcome:
        return CellOutcome(
            False,
            error_type=_error_type(exc),
            error_message=_message(exc),
            traceback=format_user_traceback(exc),
            interrupted=isinstance(exc, KeyboardInterrupt),
        )


# The refusals the guards raise, matched by identity: a user subclass, a ``__class__`` property
# or a metaclass ``__eq__`` must not pick the error_type the worker reports.
_REFUSALS = tuple(
    (kind, kind.error_type) for kind in (RestrictedError, ImportBlockedError, GuardError)
)


def _error_type(exc: BaseException) -> str:
    kind = type(exc)
    for refusal, error_type in _REFUSALS:
        if kind is refusal:
            return error_type
    name = kind.__name__
    if name in RESERVED_ERROR_TYPES:
        return f"{kind.__module__}.{name}"
    return name


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # a user __str__ that raises, even SystemExit
        text = f"<{type(exc).__name__} whose str() failed>"
    return text[:MAX_MESSAGE_CHARS]


def format_user_traceback(exc: BaseException) -> str:
    """The traceback with every frame outside the user's cells left out."""
    try:
        import traceback  # on a cell's first error, not at the worker's start (~2 ms)

        report = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
        _keep_cell_frames(report)
        return "".join(report.format())
    except BaseException:  # user __str__ or __repr__ hooks run in here
        return f"{type(exc).__name__}: <traceback unavailable>\n"


def _keep_cell_frames(report: "traceback.TracebackException") -> None:
    import traceback

    pending = [report]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = [frame for frame in current.stack if frame.filename.startswith(CELL_PREFIX)]
        current.stack = traceback.StackSummary.from_list(frames)
        linked = [current.__cause__, current.__context__, *(current.exceptions or [])]
        pending.extend(item for item in linked if item is not None)
