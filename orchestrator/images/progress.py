"""How an image build reports what it is doing. The CLI shows it with rich; library callers that
do not care get ``NullProgress``. Methods are called from the event loop thread only."""

from __future__ import annotations

import logging
from typing import Protocol

__all__ = ["BuildProgress", "LoggingProgress", "NullProgress"]


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
