"""``sandhold serve --config FILE``: every option of ``serve`` in one TOML file, validated like a
policy (unknown keys refused; an error names the file, the key and the reason). An option given
on the command line, or through its environment variable, overrides the file; the file
overrides the built-in defaults. Paths in the file are relative to the file's directory::

    host = "0.0.0.0"
    port = 8080
    policy = "strict"
    tenants = "tenants.toml"
    pool = 4
    pool_idle = 600
    data_dir = "/var/lib/sandhold"
    registry = "/var/lib/sandhold/registry.db"
    max_sessions = 200
    keep_sessions = true
    max_connections = 2048
    max_connections_per_client = 256
    header_timeout = 10.0
    keep_alive_timeout = 5.0
    auth_failures_per_minute = 30
    max_streams_per_tenant = 16
    log_format = "json"
    backend = "kubernetes"          # docs/kubernetes.md; default "docker"
    kubeconfig = "kubeconfig.yaml"
    context = "sandhold"
    namespace = "sandhold"
    runtime_class = "gvisor"
    seccomp_profile = "localhost/sandhold.json"
    pod_pids_limit = 256
    network_isolated = true
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from orchestrator._core import DEFAULT_POOL_IDLE, MAX_POOL_SIZE, BackendConfig, OrchestratorConfig
from orchestrator.errors import ConfigFileError, InvalidArgumentError
from orchestrator.http import HttpLimitsConfig
from orchestrator.policy import first_problem

__all__ = ["ServeSettings", "load_config_file", "resolve_settings"]

_LIMITS = HttpLimitsConfig()
# Where an option's value came from that wins over the file: the person, or their environment
# (the names of click's ``ParameterSource``, whichever click typer carries).
_GIVEN = frozenset({"COMMANDLINE", "ENVIRONMENT"})
_PATHS = ("tenants", "data_dir", "registry", "kubeconfig")
# The options of the Kubernetes backend (``backend.kubernetes.KubernetesSettings``).
KUBERNETES_OPTIONS = (
    "kubeconfig",
    "context",
    "namespace",
    "runtime_class",
    "seccomp_profile",
    "pod_pids_limit",
    "network_isolated",
)


class ServeSettings(BaseModel):
    """Every option of ``sandhold serve``, by its name with ``_`` for ``-``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    port: int = Field(default=8080, ge=0, le=65535)
    e2b_port: int | None = Field(default=None, ge=0, le=65535)
    tenants: Path | None = None
    policy: str | None = Field(default=None, min_length=1)
    # None: the default pool (``DEFAULT_SERVE_POOL``), or none for a default policy given as a file.
    pool: int | None = Field(default=None, ge=0, le=MAX_POOL_SIZE)
    pool_idle: float = Field(default=DEFAULT_POOL_IDLE, ge=1.0)
    data_dir: Path | None = None
    registry: Path | None = None
    max_sessions: int = Field(default=OrchestratorConfig.max_sessions, ge=1)
    keep_sessions: bool = False
    max_connections: int = Field(default=_LIMITS.max_connections, ge=1)
    max_connections_per_client: int = Field(default=_LIMITS.max_connections_per_client, ge=1)
    header_timeout: float = Field(default=_LIMITS.header_timeout, ge=0.1)
    keep_alive_timeout: float = Field(default=_LIMITS.keep_alive_timeout, ge=0.1)
    auth_failures_per_minute: int = Field(default=_LIMITS.auth_failures_per_minute, ge=1)
    max_streams_per_tenant: int = Field(default=_LIMITS.max_streams_per_tenant, ge=1)
    log_format: Literal["text", "json"] = "text"
    backend: Literal["docker", "kubernetes"] = "docker"
    kubeconfig: Path | None = None
    context: str | None = Field(default=None, min_length=1, max_length=253)
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    runtime_class: str | None = Field(default=None, min_length=1, max_length=253)
    seccomp_profile: str | None = Field(default=None, min_length=1, max_length=4096)
    pod_pids_limit: int | None = Field(default=None, ge=1)
    network_isolated: bool = False

    def backend_config(self) -> BackendConfig:
        """The engine these settings choose; Kubernetes' options on another engine are refused
        rather than ignored."""
        options = {
            k: getattr(self, k) for k in KUBERNETES_OPTIONS if getattr(self, k) not in (None, False)
        }
        if self.backend != "kubernetes" and options:
            given = ", ".join(f"--{k.replace('_', '-')}" for k in options)
            raise InvalidArgumentError(f"{given}: only with --backend kubernetes")
        return BackendConfig(name=self.backend, options=options)


def load_config_file(path: Path) -> dict[str, Any]:
    """The settings ``path`` sets (validated; relative paths made relative to its directory)."""
    try:
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigFileError(str(path), "-", "file not found") from None
    except OSError as exc:
        raise ConfigFileError(str(path), "-", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(str(path), "-", f"not valid TOML: {exc}") from None
    try:
        checked = ServeSettings.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ConfigFileError(str(path), *first_problem(exc)) from None
    found = {name: getattr(checked, name) for name in raw}
    for name in _PATHS:
        value = found.get(name)
        if isinstance(value, Path) and not value.is_absolute():
            found[name] = path.parent / value
    return found


def resolve_settings(
    config_file: Path | None, options: Mapping[str, Any], sources: Mapping[str, Any]
) -> ServeSettings:
    """The file's settings, overridden by each option the command line or the environment gave
    (``sources``: click's ``ParameterSource`` of each option)."""
    settings = load_config_file(config_file) if config_file is not None else {}
    for name in ServeSettings.model_fields:
        given = getattr(sources.get(name), "name", None) in _GIVEN
        if name in options and (given or name not in settings):
            settings[name] = options[name]
    try:
        return ServeSettings.model_validate(settings)
    except pydantic.ValidationError as exc:
        key, reason = first_problem(exc)
        raise InvalidArgumentError(f"--{key.replace('_', '-')}: {reason}") from None
