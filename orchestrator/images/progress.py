"""How an image build reports what it is doing. The CLI shows it with rich; library callers that
do not care get ``NullProgress``. Methods are called from the event loop thread only.

A build a session sets off (a template's image made on its first use) logs its steps
(``LoggingProgress``), and reports them to whoever waits for that session too: the caller wraps
its call in ``watching_builds(progress)`` (``sandhold run``'s progress display, an MCP call's
progress notifications), and the image source reports to ``watched(...)``, which adds the
watcher of the calling context, if any (a context variable, so each call sees only its own).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol

__all__ = [
    "ONE_TIME_BUILD",
    "BuildProgress",
    "LoggingProgress",
    "NullProgress",
    "watched",
    "watching_builds",
]


class BuildProgress(Protocol):
    """Receives the steps of an image build and the log lines of the step running."""

    def step(self, name: str) -> None:
        """A step starts; log lines that follow belong to it."""

    def log(self, line: str) -> None:
        """One line of output (a tool's log, or a note from sandhold itself)."""

    def done(self, name: str) -> None:
        """The step ``name`` finished."""


class NullProgress:
    """Discards everything."""

    def step(self, name: str) -> None:
        pass

    def log(self, line: str) -> None:
        pass

    def done(self, name: str) -> None:
        pass


class LoggingProgress:
    """Steps to a logger at INFO, tool lines at DEBUG: a build that a session's creation set
    off (a template's first use) shows in the server's log, not on anyone's terminal."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self._what = what

    def step(self, name: str) -> None:
        self._log.info("%s: %s", self._what, name)

    def log(self, line: str) -> None:
        self._log.debug("%s: %s", self._what, line)

    def done(self, name: str) -> None:
        self._log.info("%s: %s done", self._what, name)


# How the step that announces a build starts: what a watcher hears first.
ONE_TIME_BUILD = "one-time build"

_watcher: ContextVar[BuildProgress | None] = ContextVar("sandhold_build_watcher", default=None)


@contextlib.contextmanager
def watching_builds(progress: BuildProgress) -> Iterator[None]:
    """Image builds set off in this context (and the tasks it starts) report to ``progress``
    too."""
    token = _watcher.set(progress)
    try:
        yield
    finally:
        _watcher.reset(token)


def watched(progress: BuildProgress) -> BuildProgress:
    """``progress``, and the watcher of the calling context when there is one: the watcher
    hears a build from its announcement on (a step starting with ``ONE_TIME_BUILD``), and
    nothing of an image found current."""
    watcher = _watcher.get()
    return progress if watcher is None else _Both(progress, _FromAnnouncement(watcher))


class _FromAnnouncement:
    def __init__(self, inner: BuildProgress) -> None:
        self._inner = inner
        self._building = False

    def step(self, name: str) -> None:
        self._building = self._building or name.startswith(ONE_TIME_BUILD)
        if self._building:
            self._inner.step(name)

    def log(self, line: str) -> None:
        if self._building:
            self._inner.log(line)

    def done(self, name: str) -> None:
        if self._building:
            self._inner.done(name)


class _Both:
    def __init__(self, first: BuildProgress, second: BuildProgress) -> None:
        self._parts = (first, second)

    def step(self, name: str) -> None:
        for part in self._parts:
            part.step(name)

    def log(self, line: str) -> None:
        for part in self._parts:
            part.log(line)

    def done(self, name: str) -> None:
        for part in self._parts:
            part.done(name)
