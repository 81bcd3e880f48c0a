"""Server-sent events, read line by line: how ``sandhold serve`` streams a cell's output (REST's
``execute``) and an MCP call's progress. Pure: the caller reads the lines its own way (blocking
or async) and decodes each event's data itself.

Invariant: one event holds at most ``max_bytes`` of data; a longer one is refused
(``ValueError``) rather than held, since the server never sends one.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.client._answers import MAX_ANSWER_BYTES

__all__ = ["Event", "EventDecoder"]


@dataclass(frozen=True)
class Event:
    """One event: its name (``message`` when the server gave none) and its data lines, joined."""

    name: str
    data: str


class EventDecoder:
    """Feed it the stream's lines (line ends stripped or not); each blank line completes an
    event. Comments (``:``, the server's keep-alives) and fields other than ``event`` and
    ``data`` are skipped."""

    def __init__(self, *, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self._max_bytes = max_bytes
        self._name: str | None = None
        self._data: list[str] = []
        self._size = 0

    def feed(self, line: str) -> Event | None:
        """The event ``line`` completes, if it completes one with data."""
        line = line.rstrip("\r\n")
        if not line:
            return self.end()
        if line.startswith("event:"):
            self._name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data = line.removeprefix("data:").removeprefix(" ")
            self._size += len(data)
            if self._size > self._max_bytes:
                raise ValueError(f"an event larger than {self._max_bytes} bytes")
            self._data.append(data)
        return None

    def end(self) -> Event | None:
        """The event gathered so far (at a blank line, or what a stream left unterminated when
        it ended), if it has data; the decoder starts a new one."""
        event = Event(self._name or "message", "\n".join(self._data)) if self._data else None
        self._name, self._data, self._size = None, [], 0
        return event
