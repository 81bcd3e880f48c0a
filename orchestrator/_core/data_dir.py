"""Where sandhold keeps its files (the local key, the registry, the tenants file), and the move of
a data directory of the old name. Standard library only: every ``sandhold`` command calls this
first, before it knows what else it needs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# The tenants file in the data directory: `sandhold tenant` writes it, `sandhold serve` reads it.
TENANTS_FILE = "tenants.toml"


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$SANDHOLD_DATA_DIR``, else ``$XDG_DATA_HOME/sandhold``, else
    ``~/.local/share/sandhold``."""
    env = os.environ if environ is None else environ
    if env.get("SANDHOLD_DATA_DIR"):
        return Path(env["SANDHOLD_DATA_DIR"])
    if env.get("XDG_DATA_HOME"):
        return Path(env["XDG_DATA_HOME"]) / "sandhold"
    return Path.home() / ".local" / "share" / "sandhold"


# The data directory's name before the project was renamed; moved once, so an upgrade keeps the
# registry (and with it the orchestrator id its containers carry), the local key and the tenants.
LEGACY_DATA_DIR_NAME = "s" + "bx"


def migrate_legacy_data_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """Move ``<data home>/sandhold`` to the current data directory when only the old one exists;
    returns where it now is, or None when there was nothing to move (or a directory is set)."""
    env = os.environ if environ is None else environ
    if env.get("SANDHOLD_DATA_DIR"):
        return None
    current = data_dir(env)
    legacy = current.parent / LEGACY_DATA_DIR_NAME
    if current.exists() or not legacy.is_dir():
        return None
    os.rename(legacy, current)
    return current
