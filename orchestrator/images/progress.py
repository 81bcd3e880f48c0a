"""How an image build reports what it is doing. The CLI shows it with rich; library callers that
do not care get ``NullProgress``. Methods are called from the event loop thread only."""

from __future__ import annotations

from typing import Protocol

__all__ = ["BuildProgress", "NullProgress"]


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
