"""Telling a command's stderr from its stdout when both arrive on one pipe.

sandhold's pipe terminals merge the two streams; E2B's clients keep them apart (a
``CommandExitException`` carries the stderr). So each command's stderr goes through ``sed``,
which starts every line of it with a marker of 16 random hex digits made for that command; the
merged stream is then split on the marker. One line of stderr is one ``write`` of at most a
pipe buffer, so it arrives whole, never cut by stdout; a marker can only be forged by output
that guesses it."""

from __future__ import annotations

import secrets
import shlex

__all__ = ["Demux", "new_marker", "with_stderr_marked"]


def new_marker() -> str:
    return f"\x1e{secrets.token_hex(8)}:"


def with_stderr_marked(command: str, marker: str) -> str:
    """``command`` (a bash command line) with its stderr lines marked; its exit status kept,
    and the marking finished before the shell exits (bash 5.1+ waits on ``$!`` for a process
    substitution)."""
    sed = shlex.join(["sed", "-u", f"s/^/{marker}/"])
    return f"{{ {command}\n}} 2> >(exec {sed}); __e2b_rc=$?; wait $! 2>/dev/null; exit $__e2b_rc"


class Demux:
    """Feed it the merged text as it comes; it gives back (stdout, stderr) text."""

    def __init__(self, marker: str) -> None:
        self._marker = marker
        self._pending = ""

    def feed(self, text: str, *, final: bool = False) -> tuple[str, str]:
        data = self._pending + text
        self._pending = ""
        out: list[str] = []
        err: list[str] = []
        m = self._marker
        while data:
            at = data.find(m)
            if at < 0:
                keep = _partial_suffix(data, m) if not final else 0
                out.append(data[: len(data) - keep])
                self._pending = data[len(data) - keep :]
                break
            out.append(data[:at])
            end = data.find("\n", at + len(m))
            if end < 0:
                if final:
                    err.append(data[at + len(m) :])
                else:
                    self._pending = data[at:]
                break
            err.append(data[at + len(m) : end + 1])
            data = data[end + 1 :]
        return "".join(out), "".join(err)


def _partial_suffix(data: str, marker: str) -> int:
    """How many characters at the end of ``data`` could begin a marker."""
    for size in range(min(len(marker) - 1, len(data)), 0, -1):
        if marker.startswith(data[-size:]):
            return size
    return 0
