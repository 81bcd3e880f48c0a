"""Refusals raised at run time by restricted mode. They reach user code as ordinary exceptions
(so ``except ImportError`` around an optional import still works) and the worker reports them
under their ``error_type`` rather than their class name."""

from typing import ClassVar

# Tracebacks name the classes ``sandhold.ImportBlockedError``..., not after the worker's file
# layout.
_SHOWN_MODULE = "sandhold"


class RestrictedError(Exception):
    """Something the restricted mode refuses; the base of every run-time refusal."""

    error_type: ClassVar[str] = "validation"


class ImportBlockedError(RestrictedError, ImportError):
    """A module outside the allowlist was imported or reached through an attribute."""

    error_type: ClassVar[str] = "import_blocked"


class GuardError(RestrictedError):
    """An attribute, format field or call the runtime guards refuse."""

    error_type: ClassVar[str] = "validation"


for _refusal in (RestrictedError, ImportBlockedError, GuardError):
    _refusal.__module__ = _SHOWN_MODULE
