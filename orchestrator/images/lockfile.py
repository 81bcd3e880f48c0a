"""Pinned pip requirements with hashes: the lock files of templates (``python-data.lock``, a
user template's ``pip`` list), parsed and checked before anything is downloaded.

The format is the subset of pip's requirements files that ``--require-hashes`` accepts and that
says exactly which bytes go in: one requirement per logical line (``\\`` continues a line), each
``name==version`` followed by one or more ``--hash=sha256:<64 hex>``; ``#`` starts a comment.
No extras, markers, URLs, options or ranges: what is not pinned to a set of files is refused,
naming the line. Pure: nothing here reads the network.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["LockError", "Pin", "canonical_name", "lock_digest", "parse_lock", "render_lock"]

# PEP 508 names and PEP 440 versions as they appear in a pin (no local versions, no spaces).
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.!+_-]{0,63}$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
# More than any real lock holds; a bigger file is a mistake, not a lock.
MAX_PINS = 500
MAX_HASHES_PER_PIN = 200


class LockError(ValueError):
    """A lock line that pins nothing exactly; the message names the line."""


@dataclass(frozen=True)
class Pin:
    """One requirement: a name (canonical), its exact version, and the sha256 of every file
    that may satisfy it (one per platform and Python a wheel is built for)."""

    name: str
    version: str
    hashes: tuple[str, ...]

    def line(self) -> str:
        """The pin as pip reads it, hashes sorted, on continuation lines."""
        hashes = " \\\n".join(f"    --hash=sha256:{digest}" for digest in self.hashes)
        return f"{self.name}=={self.version} \\\n{hashes}"


def canonical_name(name: str) -> str:
    """PEP 503's normal form: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> tuple[Pin, ...]:
    """Every pin of ``text``, sorted by name; a ``LockError`` for any line that is not one."""
    pins: dict[str, Pin] = {}
    for number, line in _logical_lines(text):
        pin = _parse_line(line, number)
        if pin.name in pins:
            raise LockError(f"line {number}: {pin.name} is pinned twice")
        pins[pin.name] = pin
        if len(pins) > MAX_PINS:
            raise LockError(f"more than {MAX_PINS} requirements")
    return tuple(sorted(pins.values(), key=lambda pin: pin.name))


def render_lock(pins: Iterable[Pin], *, header: str = "") -> str:
    """The lock text of ``pins``: what ``parse_lock`` reads back to the same pins."""
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    body = "\n".join(pin.line() for pin in sorted(pins, key=lambda pin: pin.name))
    return f"{comment}{body}\n"


def lock_digest(pins: Iterable[Pin]) -> str:
    """sha256 over the pins alone (not comments or layout): two texts that pin the same files
    build the same image."""
    canonical = "\n".join(
        f"{pin.name}=={pin.version} {' '.join(sorted(pin.hashes))}"
        for pin in sorted(pins, key=lambda pin: pin.name)
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first physical line number, joined text) of each non-empty logical line."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(part.strip() for part in pending).strip()
        pending = []
        if joined:
            yield start, joined
    if pending:
        raise LockError(f"line {start}: the file ends inside a continued line")


def _parse_line(line: str, number: int) -> Pin:
    spec, *options = line.split()
    name, sep, version = spec.partition("==")
    if not sep or not _NAME.match(name) or not _VERSION.match(version):
        raise LockError(
            f"line {number}: {spec[:80]!r} is not pinned as name==version (no ranges, extras, "
            "markers or URLs)"
        )
    hashes = []
    for option in options:
        found = _HASH.match(option)
        if found is None:
            raise LockError(
                f"line {number}: {option[:80]!r}: only --hash=sha256:<64 hex digits> may follow "
                "a pin"
            )
        hashes.append(found.group(1))
    if not hashes:
        raise LockError(f"line {number}: {spec} has no --hash=sha256:... (every file is pinned)")
    if len(hashes) > MAX_HASHES_PER_PIN:
        raise LockError(f"line {number}: more than {MAX_HASHES_PER_PIN} hashes")
    return Pin(canonical_name(name), version, tuple(sorted(set(hashes))))
