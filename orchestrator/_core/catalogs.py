"""The policies and image templates an orchestrator knows: loaded whole at start and again at each
reload (SIGHUP), so a caller's policy is resolved in memory, never from the filesystem.

Invariants: a reload that fails (a broken file, a pool's policy gone) changes nothing; templates
and policies are replaced together, policies checked against those templates; loading reads
files, so it runs in a worker thread when an event loop is running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.images.templates import TemplateCatalog, load_catalog
from orchestrator.policy.catalog import PolicyCatalog
from orchestrator.policy.model import Policy

__all__ = ["Catalogs"]


class Catalogs:
    def __init__(
        self,
        *,
        policy_dirs: Sequence[Path],
        default_policy: str,
        template_dirs: Callable[[], Sequence[Path]],
        required: Callable[[], set[str]],
    ) -> None:
        self._policy_dirs = policy_dirs
        self._default_policy = default_policy
        self._template_dirs = template_dirs
        # Policies that must load (the warm pools'): a reload without one is refused.
        self._required = required
        self._policies: PolicyCatalog | None = None
        self._templates: TemplateCatalog | None = None

    def policy(self, name: Any) -> Policy:
        """The loaded policy of that name (None: the default)."""
        return self.policies().get(name)

    def policies(self) -> PolicyCatalog:
        """The policies loaded at start or at the last reload (loaded here when neither ran)."""
        if self._policies is None:
            self._policies = self._load_policies(self.templates())
        return self._policies

    def templates(self) -> TemplateCatalog:
        """The image templates: shipped, and those of the template directories."""
        if self._templates is None:
            self._templates = load_catalog(self._template_dirs())
        return self._templates

    async def load(self) -> None:
        """Load the policies (at start), in a worker thread."""
        self._policies = await anyio.to_thread.run_sync(self._load_policies, self.templates())

    async def reload(self) -> PolicyCatalog:
        """Read templates and policies again; on success both are replaced."""
        catalog = await anyio.to_thread.run_sync(load_catalog, self._template_dirs())
        policies = await anyio.to_thread.run_sync(self._load_policies, catalog)
        self._policies, self._templates = policies, catalog
        return policies

    def _load_policies(self, catalog: TemplateCatalog) -> PolicyCatalog:
        loaded = PolicyCatalog.load(
            self._policy_dirs, default=self._default_policy, templates=catalog.names()
        )
        loaded.require(self._required())
        return loaded
