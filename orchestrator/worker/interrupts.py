"""SIGINT handling. The host interrupts a cell with SIGINT; the interrupt must end user code and
nothing else. While user code runs the gate is armed and SIGINT raises KeyboardInterrupt there;
at any other moment (idle, parsing a request, writing a reply) it is counted and ignored, so an
interrupt that arrives late can neither kill the worker nor lose or duplicate a reply.

Invariant: the handler disarms the gate when it raises, so one arming yields at most one
KeyboardInterrupt; code that arms the gate catches KeyboardInterrupt around the armed region."""

import _signal  # type: ignore[import-not-found]  # getsignal without the Enum lookup
import signal
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class InterruptGate:
    """Raise KeyboardInterrupt on SIGINT only while armed."""

    def __init__(self) -> None:
        self.armed = False
        self.ignored = 0

    def install(self) -> None:
        """Take SIGINT; also before each cell, since unrestricted code may have taken it."""
        # signal.getsignal() looks the handler up in an Enum first: ~5 us on every cell.
        if _signal.getsignal(signal.SIGINT) != self._handle:
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        self.ignored += 1

    def call(self, function: Callable[[], T]) -> T:
        """Run user-supplied code (a cell, a ``__repr__``) with the gate armed."""
        try:
            self.armed = True
            return function()
        finally:
            self.armed = False
