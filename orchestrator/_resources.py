"""Where the files that ship beside the package live: in an installed wheel they are copied into
``orchestrator/_data``; in a source checkout (editable install) they sit at the top of the tree."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@cache
def data_root() -> Path:
    bundled = _PACKAGE / "_data"
    return bundled if bundled.is_dir() else _PACKAGE.parent


def shipped_policies_dir() -> Path:
    return data_root() / "policies"


def worker_dockerfile() -> Path:
    return data_root() / "Dockerfile.worker"


def worker_source_dir() -> Path:
    """The stdlib-only code copied into the image."""
    return _PACKAGE / "worker"


def shipped_templates_dir() -> Path:
    """The shipped image templates (``python-data.toml`` and its lock)."""
    return data_root() / "images" / "templates"


def template_dockerfile() -> Path:
    """The Dockerfile that installs a template's locked wheels on top of its parent image."""
    return data_root() / "images" / "Dockerfile.template"
