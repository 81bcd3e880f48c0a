"""Logging that a flood cannot grow without bound: each kind of message (logger, level, format,
and for access lines the status) may be written ``burst`` times at once and then
``per_second`` times a second; the first one written after a stretch of silence says how many
were left out. A log that repeats itself says so once, not 194,000 times."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Final

from orchestrator.http._limits import Budgets

# Enough for every distinct message of a normal minute to get through at once...
LOG_BURST: Final = 50
# ...and then a line every 100 ms per kind of message: readable, and bounded under any flood.
LOG_PER_SECOND: Final = 10.0
# Kinds of message remembered at once (the oldest forgotten first).
MAX_MESSAGE_KINDS: Final = 1000
ACCESS_LOGGER: Final = "uvicorn.access"


def _kind(record: logging.LogRecord) -> Hashable:
    kind: tuple[Hashable, ...] = (record.name, record.levelno, str(record.msg))
    # uvicorn's access line: (client, method, path, version, status); only the status matters.
    if record.name == ACCESS_LOGGER and isinstance(record.args, tuple) and record.args:
        kind += (record.args[-1],)
    return kind


class RateLimitedLog(logging.Filter):
    """A filter, shared by every handler it is added to (one budget for all of them)."""

    def __init__(
        self,
        burst: int = LOG_BURST,
        per_second: float = LOG_PER_SECOND,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._budgets: Budgets[Hashable] = Budgets(
            burst, per_second, max_keys=MAX_MESSAGE_KINDS, clock=clock
        )
        self._suppressed: dict[Hashable, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = _kind(record)
        if not self._budgets.spend(kind):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            if len(self._suppressed) > MAX_MESSAGE_KINDS:
                del self._suppressed[next(iter(self._suppressed))]
            return False
        if skipped := self._suppressed.pop(kind, 0):
            record.msg = f"{record.getMessage()} ({skipped} more like this were not logged)"
            record.args = None
        return True


def limit_log_rate(
    logger_names: Iterable[str] = ("", "uvicorn", "uvicorn.error", ACCESS_LOGGER, "asyncio"),
) -> RateLimitedLog:
    """Add one ``RateLimitedLog`` to every handler of these loggers (the root's included)."""
    limiter = RateLimitedLog()
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RateLimitedLog) for f in handler.filters):
                handler.addFilter(limiter)
    return limiter
