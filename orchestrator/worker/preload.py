"""Warm preload: a pooled session's worker imports its template's modules (numpy, pandas,
matplotlib.pyplot ...) before anyone owns it, so the owner's first ``import pandas`` finds the
module in ``sys.modules`` and costs nothing.

Only modules the session's policy would let its code import are preloaded: in restricted mode
each name goes through the same ``ModulePolicy`` as a cell's import. That is not what keeps a
preloaded module from restricted code: a cell's import is checked by name whether or not the
module is loaded (``Restrictions.import_module`` checks before it imports), and a module reached
through an attribute is checked by its own name. It keeps a restricted session from carrying
more than its owner could have loaded by itself."""

import importlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # restrict.py is imported only by a restricted worker (see executor.py)
    from .restrict import Restrictions

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_MODULES = 64
# A reason longer than this is the tail of a long exception message; the start says enough.
MAX_REASON_CHARS = 900


def preload(modules: object, restrictions: "Restrictions | None") -> dict[str, object]:
    """Import each of ``modules``; the reply says which loaded and why the others did not."""
    if not isinstance(modules, list) or len(modules) > MAX_MODULES:
        raise ValueError(f"modules must be a list of at most {MAX_MODULES} names")
    loaded: list[str] = []
    skipped: list[str] = []
    for name in modules:
        if type(name) is not str or not _MODULE_NAME.match(name):
            skipped.append(f"{str(name)[:200]!r}: not a module name")
            continue
        refusal = restrictions.modules.refusal(name) if restrictions is not None else None
        if refusal is not None:
            skipped.append(f"{name}: {refusal}"[:MAX_REASON_CHARS])
            continue
        try:
            importlib.import_module(name)
        except BaseException as exc:  # an import that fails leaves the session as it was
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            skipped.append(f"{name}: {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS])
            continue
        loaded.append(name)
    return {"loaded": loaded, "skipped": skipped}
