"""How many policy case runs go at once. Apart from the runner, so that the command line can
show these bounds in its options without importing the orchestrator."""

from __future__ import annotations

__all__ = ["DEFAULT_JOBS", "MAX_JOBS"]

# Two cores run about three sandboxes' start-up at once; more only queue in the engine.
DEFAULT_JOBS = 4
MAX_JOBS = 64
