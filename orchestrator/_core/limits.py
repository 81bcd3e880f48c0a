"""The bounds of one orchestrator that its settings default to or are checked against. Apart from
the manager, so that ``sandhold serve --help`` can show them without importing it."""

from __future__ import annotations

from typing import Final

# Sessions one orchestrator holds at most, all tenants together (``OrchestratorConfig``).
DEFAULT_MAX_SESSIONS: Final = 100
# Ready sessions one warm pool may be asked to keep.
MAX_POOL_SIZE: Final = 256
