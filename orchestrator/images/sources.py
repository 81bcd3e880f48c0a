"""Finding a Debian mirror in the machine's own apt sources, so debootstrap fetches from wherever
this host already fetches packages (sandhold never names a mirror itself).

Both formats apt reads are understood: one-line ``sources.list`` entries and deb822 ``.sources``
paragraphs. Pure functions over files; nothing here runs a tool or touches the network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AptSource", "find_mirror", "parse_deb822", "parse_one_line", "read_sources"]

DEFAULT_APT_DIR = Path("/etc/apt")
# Schemes debootstrap can fetch from by itself; apt-only transports (mirror+, tor+, cdrom:) are not.
_FETCHABLE = re.compile(r"^(https?|ftp|file):", re.IGNORECASE)
# Suites that carry only a slice of the archive; a root file system needs the release suite.
_PARTIAL_SUITE = re.compile(r"[-/](security|updates|backports|proposed|proposed-updates)$")


@dataclass(frozen=True)
class AptSource:
    """One apt source entry: where, which suites, for binary (``deb``) or source packages."""

    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    enabled: bool = True


def find_mirror(suite: str, *, apt_dir: Path = DEFAULT_APT_DIR) -> str | None:
    """The URI of an enabled ``deb`` source serving ``suite``, else of one serving some release
    suite (one archive serves every release of its distribution), else None."""
    candidates = [s for s in read_sources(apt_dir) if s.enabled and "deb" in s.types]
    for source in candidates:
        if suite in source.suites:
            return _first_fetchable(source.uris)
    for source in candidates:
        if any(not _PARTIAL_SUITE.search(s) for s in source.suites):
            uri = _first_fetchable(source.uris)
            if uri is not None:
                return uri
    return None


def _first_fetchable(uris: Iterable[str]) -> str | None:
    return next((uri for uri in uris if _FETCHABLE.match(uri)), None)


def read_sources(apt_dir: Path = DEFAULT_APT_DIR) -> list[AptSource]:
    """Every entry of ``sources.list`` and ``sources.list.d/*.list|*.sources``, in apt's order."""
    found: list[AptSource] = []
    main = apt_dir / "sources.list"
    if main.is_file():
        found.extend(parse_one_line(_read(main)))
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if path.suffix == ".list" and path.is_file():
                found.extend(parse_one_line(_read(path)))
            elif path.suffix == ".sources" and path.is_file():
                found.extend(parse_deb822(_read(path)))
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def parse_one_line(text: str) -> Iterator[AptSource]:
    """``deb [options] uri suite [component...]`` lines; ``#`` starts a comment anywhere."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        rest = rest.strip()
        if rest.startswith("["):
            _, _, rest = rest.partition("]")
        fields = rest.split()
        if kind not in ("deb", "deb-src") or len(fields) < 2:
            continue
        yield AptSource((kind,), (fields[0],), (fields[1],), tuple(fields[2:]))


def parse_deb822(text: str) -> Iterator[AptSource]:
    """deb822 paragraphs (``Types:``, ``URIs:``, ``Suites:``, ``Components:``, ``Enabled:``)."""
    for stanza in _stanzas(text):
        types = tuple(stanza.get("types", "").split())
        uris = tuple(stanza.get("uris", "").split())
        suites = tuple(stanza.get("suites", "").split())
        if not (types and uris and suites):
            continue
        enabled = stanza.get("enabled", "yes").strip().lower() not in ("no", "false", "0")
        components = tuple(stanza.get("components", "").split())
        yield AptSource(types, uris, suites, components, enabled)


def _stanzas(text: str) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    key: str | None = None
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                yield fields
            fields, key = {}, None
        elif raw[0] in " \t":
            if key is not None:
                fields[key] += " " + raw.strip()
        elif ":" in raw:
            name, _, value = raw.partition(":")
            key = name.strip().lower()
            fields[key] = value.strip()
