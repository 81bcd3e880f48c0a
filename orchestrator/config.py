"""Settings of an orchestrator: small, keyword-only, immutable; ``from_env`` for the CLI."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.audit import AuditConfig
from orchestrator.errors import InvalidArgumentError


@dataclass(frozen=True, kw_only=True)
class OrchestratorConfig:
    default_policy: str = "default"
    policy_dirs: tuple[Path, ...] = ()
    image: str | None = None
    orchestrator_id: str = field(default_factory=lambda: f"sbx-{secrets.token_hex(6)}")
    tenant: str = "local"
    extra_labels: dict[str, str] = field(default_factory=dict)
    busy_timeout: float = 30.0
    max_sessions: int = 100
    # Upper bound on how often idle and lifetime limits are checked (seconds).
    reap_interval: float = 30.0
    # Warm pools to keep from the start: policy name -> ready sessions.
    pool: dict[str, int] = field(default_factory=dict)
    # Where the audit log's segments go; None keeps no audit log.
    audit_dir: Path | None = None
    audit: AuditConfig = field(default_factory=AuditConfig)

    @classmethod
    def from_env(cls, **settings: Any) -> OrchestratorConfig:
        """Settings from the environment, for the CLI: ``SBX_IMAGE`` (use this image, do not
        build), ``SBX_POLICY`` (default policy), ``SBX_ORCHESTRATOR_ID`` (the id on every
        container's labels), ``SBX_EXTRA_LABELS`` (``k=v,k2=v2`` added to every container),
        ``SBX_AUDIT_DIR`` (keep an audit log there).
        Explicit ``settings`` win."""
        env: dict[str, Any] = {}
        if image := os.environ.get("SBX_IMAGE"):
            env["image"] = image
        if policy := os.environ.get("SBX_POLICY"):
            env["default_policy"] = policy
        if orchestrator_id := os.environ.get("SBX_ORCHESTRATOR_ID"):
            env["orchestrator_id"] = orchestrator_id
        if labels := os.environ.get("SBX_EXTRA_LABELS"):
            env["extra_labels"] = _labels(labels)
        if audit_dir := os.environ.get("SBX_AUDIT_DIR"):
            env["audit_dir"] = Path(audit_dir)
        return cls(**(env | settings))


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"SBX_EXTRA_LABELS: expected key=value, got {item!r}")
        labels[key.strip()] = value.strip()
    return labels
