"""The bounds of one orchestrator that its settings default to or are checked against. Apart from
the manager, so that ``sandhold serve --help`` can show them without importing it."""

from __future__ import annotations

from typing import Final

# Sessions one orchestrator holds at most, all tenants together (``OrchestratorConfig``).
DEFAULT_MAX_SESSIONS: Final = 100
# Ready sessions one warm pool may be asked to keep.
MAX_POOL_SIZE: Final = 256
# What ``sandhold serve`` and ``sandhold mcp`` keep warm of the default policy unless told
# (``--pool``), so that a new user's first session is taken, not built; the Python API keeps
# none unless asked.
DEFAULT_SERVE_POOL: Final = 2
# Seconds without a take after which their pool drains to zero (``--pool-idle``), until the
# next take: a server left alone holds no idle containers.
DEFAULT_POOL_IDLE: Final = 300.0
