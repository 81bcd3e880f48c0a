"""Settings of an orchestrator: small, keyword-only, immutable; ``from_env`` for the CLI."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator._core.data_dir import data_dir
from orchestrator._core.limits import DEFAULT_MAX_SESSIONS, DEFAULT_SERVE_POOL
from orchestrator._core.tenants import TenantConfig
from orchestrator.audit._log import AuditConfig
from orchestrator.errors import InvalidArgumentError

# A python_repl call that finds its session's interpreter held by another call waits this long,
# then answers ``busy`` naming that call: shorter than the tool-call timeouts MCP clients are
# given (agents set 10-60 s; langchain-mcp-adapters' users 6 s in issue 32), so the caller reads
# why instead of timing out, and long enough for a short cell to finish first.
DEFAULT_BUSY_TIMEOUT = 5.0


@dataclass(frozen=True, kw_only=True)
class BackendConfig:
    """Which engine runs the sessions (``_core.engines`` knows the names) and its own settings,
    checked by that engine when it is made (the Kubernetes one: ``kubeconfig``, ``context``,
    ``namespace``, ``runtime_class``)."""

    name: str = "docker"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class OrchestratorConfig:
    # The engine: Docker unless told (a backend handed to the manager wins over this).
    backend: BackendConfig = field(default_factory=BackendConfig)
    default_policy: str = "default"
    policy_dirs: tuple[Path, ...] = ()
    # The image of the ``base`` template: None builds it (Docker), a tag uses that image.
    image: str | None = None
    # Folders of user image templates (``NAME.toml`` each); None: ``<data dir>/templates``.
    template_dirs: tuple[Path, ...] | None = None
    # Images to use for other templates instead of building them: template name -> image.
    template_images: Mapping[str, str] = field(default_factory=dict)
    # The id on every container's labels. None: the registry's (made once and kept there), or
    # a fresh one when the registry lives in memory.
    orchestrator_id: str | None = None
    tenant: str = "local"
    extra_labels: dict[str, str] = field(default_factory=dict)
    # How long a python_repl call waits for its session's interpreter before answering busy.
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    max_sessions: int = DEFAULT_MAX_SESSIONS
    # Upper bound on how often idle and lifetime limits are checked (seconds).
    reap_interval: float = 30.0
    # Warm pools to keep from the start: policy name -> ready sessions.
    pool: dict[str, int] = field(default_factory=dict)
    # A pool nothing was taken from for this long (seconds) drains to zero until the next take;
    # None keeps it full.
    pool_idle_timeout: float | None = None
    # Where the audit log's segments go; None keeps no audit log.
    audit_dir: Path | None = None
    audit: AuditConfig = field(default_factory=AuditConfig)
    # The registry's SQLite file; None keeps it in memory (nothing survives the process).
    registry_path: Path | None = None
    # Instead of one file: a directory where each orchestrator of a kind that runs side by side
    # (mcp, run, shell) takes a registry of its own, and reaps (or, with ``adopt_dead``,
    # re-adopts) the sessions of dead ones (``registry_claim``).
    registry_dir: Path | None = None
    adopt_dead: bool = False
    # On close: "destroy" every session, or "persist" them for the next start to re-adopt.
    on_shutdown: Literal["destroy", "persist"] = "destroy"
    # Tenants by name, with their allowed policies and quotas (``tenants.TenantConfig``).
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)

    @classmethod
    def from_env(cls, **settings: Any) -> OrchestratorConfig:
        """Settings from the environment, for the CLI: ``SANDHOLD_IMAGE`` (use this image, do not
        build), ``SANDHOLD_POLICY`` (default policy), ``SANDHOLD_ORCHESTRATOR_ID`` (the id on every
        container's labels), ``SANDHOLD_EXTRA_LABELS`` (``k=v,k2=v2`` added to every container),
        ``SANDHOLD_AUDIT_DIR`` (keep an audit log there), ``SANDHOLD_REGISTRY`` (the registry's
        file), ``SANDHOLD_TEMPLATES`` (template folders, ``:``-separated). Explicit ``settings``
        win."""
        env: dict[str, Any] = {}
        if image := os.environ.get("SANDHOLD_IMAGE"):
            env["image"] = image
        if policy := os.environ.get("SANDHOLD_POLICY"):
            env["default_policy"] = policy
        if orchestrator_id := os.environ.get("SANDHOLD_ORCHESTRATOR_ID"):
            env["orchestrator_id"] = orchestrator_id
        if labels := os.environ.get("SANDHOLD_EXTRA_LABELS"):
            env["extra_labels"] = _labels(labels)
        if audit_dir := os.environ.get("SANDHOLD_AUDIT_DIR"):
            env["audit_dir"] = Path(audit_dir)
        if registry := os.environ.get("SANDHOLD_REGISTRY"):
            env["registry_path"] = Path(registry)
        if templates := os.environ.get("SANDHOLD_TEMPLATES"):
            env["template_dirs"] = tuple(Path(p) for p in templates.split(":") if p)
        return cls(**(env | settings))

    def user_template_dirs(self) -> tuple[Path, ...]:
        """Where user templates are read from: ``template_dirs``, else ``<data dir>/templates``."""
        if self.template_dirs is not None:
            return self.template_dirs
        return (data_dir() / "templates",)

    def with_default_pool(self, size: int | None, idle: float) -> OrchestratorConfig:
        """For ``serve`` and ``mcp``: keeping ``size`` warm sessions of the default policy,
        drained after ``idle`` seconds without a take; ``size`` None is
        ``DEFAULT_SERVE_POOL``, or none when the default policy is a file (pools are kept per
        policy name)."""
        from orchestrator.policy.arguments import check_policy_name

        try:
            check_policy_name(self.default_policy)
        except InvalidArgumentError:
            if size:
                message = "--pool needs a policy name, not a policy file"
                raise InvalidArgumentError(message) from None
            return self
        size = DEFAULT_SERVE_POOL if size is None else size
        if not size:
            return self
        return dataclasses.replace(self, pool={self.default_policy: size}, pool_idle_timeout=idle)

    def side_by_side(self, kind: str, *, adopt: bool) -> OrchestratorConfig:
        """For a command of which several may run at once (``mcp``, ``run``, ``shell``): a
        registry of its own in ``<data dir>/orchestrators/<kind>``, unless one file is set, so
        that a later start reaps, or with ``adopt`` re-adopts, what a killed one left."""
        if self.registry_path is not None:
            return self
        directory = data_dir() / "orchestrators" / kind
        return dataclasses.replace(self, registry_dir=directory, adopt_dead=adopt)


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"SANDHOLD_EXTRA_LABELS: expected key=value, got {item!r}")
        labels[key.strip()] = value.strip()
    return labels
