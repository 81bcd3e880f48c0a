"""The reference pages generated from the code, so they cannot drift from it:
``docs/reference/tools.md`` from the tool definitions and the error types, and
``docs/reference/policy.md`` from the policy model. ``python -m orchestrator.docs_reference``
writes both (``--check`` only compares); tests/unit/test_docs.py fails when a committed page
differs from what the code makes.

An interface-level module: it reads the tool layer, the policy model and the HTTP front, and
nothing imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.docs_reference._policy import policy_reference
from orchestrator.docs_reference._tools import tools_reference

__all__ = [
    "PAGES",
    "policy_reference",
    "render_pages",
    "stale_pages",
    "tools_reference",
    "write_pages",
]

# Each generated page, by its path from the repository's root.
PAGES: Mapping[str, Callable[[], str]] = {
    "docs/reference/tools.md": tools_reference,
    "docs/reference/policy.md": policy_reference,
}


def render_pages() -> dict[str, str]:
    """Every generated page's text, by path."""
    return {path: render() for path, render in PAGES.items()}


def stale_pages(root: Path) -> list[str]:
    """The pages under ``root`` that are missing or differ from what the code makes."""
    stale = []
    for path, text in render_pages().items():
        file = root / path
        if not file.is_file() or file.read_text(encoding="utf-8") != text:
            stale.append(path)
    return stale


def write_pages(root: Path) -> list[Path]:
    """Write every page under ``root``; the files written."""
    written = []
    for path, text in render_pages().items():
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
        written.append(file)
    return written
