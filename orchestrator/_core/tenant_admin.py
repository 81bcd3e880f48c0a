"""Changing a tenants file (``sandhold tenant add``, ``rotate``): the file is read and validated
as ``sandhold serve`` reads it, changed, validated again, and written whole.

Invariants: a key exists in the clear only in what ``add`` and ``rotate`` return (the caller
shows it once); the file holds its sha256. The file is replaced atomically (a private temporary
file in the same directory, flushed, renamed over it), so a server reading it (at start or on
SIGHUP) sees the old file or the new one, never half of one; changes are serialised by a lock
file beside it, so two commands at once do not lose one another's tenant. The file is written
from its model: comments a person added are not kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pydantic

from orchestrator._core.data_dir import TENANTS_FILE
from orchestrator._core.tenants import (
    OperatorConfig,
    TenantConfig,
    TenantQuotas,
    TenantsFile,
    hash_key,
    load_tenants_file,
    new_key,
)
from orchestrator.errors import InvalidArgumentError, TenantsFileError
from orchestrator.policy._validation import first_problem

__all__ = [
    "TENANTS_FILE",
    "add_operator",
    "add_tenant",
    "format_tenants_file",
    "parse_quotas",
    "read_operators",
    "read_tenants",
    "rotate_key",
]

HEADER = (
    "# Tenants of sandhold serve, written by `sandhold tenant`; each key is kept as its sha256.\n"
)


def parse_quotas(items: list[str]) -> TenantQuotas:
    """``["sessions=10", "cpus=4"]`` as quotas; an unknown quota or a bad value is refused
    naming it."""
    raw: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidArgumentError(f"--quota: expected name=value, got {item!r}")
        raw[name.strip()] = value.strip()
    try:
        return TenantQuotas.model_validate(raw)
    except pydantic.ValidationError as exc:
        key, reason = first_problem(exc)
        raise InvalidArgumentError(f"--quota {key}: {reason}") from None


def read_tenants(path: Path) -> list[TenantConfig]:
    """The tenants of ``path``; none when it does not exist yet."""
    if not path.exists():
        return []
    return list(load_tenants_file(path).tenant)


def read_operators(path: Path) -> list[OperatorConfig]:
    """The operators of ``path``; none when it does not exist yet."""
    if not path.exists():
        return []
    return list(load_tenants_file(path).operator)


def add_operator(path: Path, name: str) -> str:
    """Add operator ``name`` to ``path`` with a new key; returns the key. A tenants file holds
    at least one tenant, so the file must have one already."""
    key = new_key()
    with _locked(path):
        tenants, operators = read_tenants(path), read_operators(path)
        if name in _names(tenants, operators):
            raise InvalidArgumentError(f"{path}: {name!r} exists (`sandhold tenant rotate`)")
        if not tenants:
            raise InvalidArgumentError(f"{path}: add a tenant first (`sandhold tenant add`)")
        try:
            entry = OperatorConfig(name=name, key_sha256=hash_key(key))
        except pydantic.ValidationError as exc:
            raise TenantsFileError(str(path), *first_problem(exc)) from None
        _write(path, tenants, [*operators, entry])
    return key


def add_tenant(
    path: Path,
    name: str,
    *,
    policies: tuple[str, ...] | None = None,
    quotas: TenantQuotas | None = None,
    egress_allow: tuple[str, ...] | None = None,
) -> str:
    """Add tenant ``name`` to ``path`` (made if missing) with a new key; returns the key."""
    key = new_key()
    with _locked(path):
        tenants = read_tenants(path)
        if name in _names(tenants, read_operators(path)):
            raise InvalidArgumentError(
                f"{path}: tenant {name!r} exists (`sandhold tenant rotate` gives it a new key)"
            )
        entry = _validated(
            path,
            {
                "name": name,
                "key_sha256": hash_key(key),
                "policies": policies,
                "quotas": quotas or TenantQuotas(),
                "egress_allow": egress_allow,
            },
        )
        _write(path, [*tenants, entry], read_operators(path))
    return key


def rotate_key(path: Path, name: str) -> str:
    """Give tenant or operator ``name`` a new key (the old one stops working once the server
    reloads)."""
    key = new_key()
    new = {"key_sha256": hash_key(key)}
    with _locked(path):
        tenants, operators = read_tenants(path), read_operators(path)
        if name not in _names(tenants, operators):
            raise InvalidArgumentError(f"{path}: no tenant or operator named {name!r}")
        _write(
            path,
            [t.model_copy(update=new) if t.name == name else t for t in tenants],
            [o.model_copy(update=new) if o.name == name else o for o in operators],
        )
    return key


def _names(tenants: list[TenantConfig], operators: list[OperatorConfig]) -> set[str]:
    return {t.name for t in tenants} | {o.name for o in operators}


def _validated(path: Path, fields: Mapping[str, Any]) -> TenantConfig:
    try:
        return TenantConfig.model_validate(dict(fields))
    except pydantic.ValidationError as exc:
        raise TenantsFileError(str(path), *first_problem(exc)) from None


def format_tenants_file(
    tenants: list[TenantConfig], operators: list[OperatorConfig] | None = None
) -> str:
    """The file's text: one ``[[tenant]]`` table each, policies, egress cap and quotas only
    where set, then one ``[[operator]]`` each. Every value is a name, a rule, a hex digest or a
    number, which JSON and TOML spell alike."""
    parts = [HEADER]
    for tenant in tenants:
        lines = ["", "[[tenant]]", f"name = {json.dumps(tenant.name)}"]
        lines.append(f"key_sha256 = {json.dumps(tenant.key_sha256)}")
        if tenant.policies is not None:
            lines.append(f"policies = {json.dumps(list(tenant.policies))}")
        if tenant.egress_allow is not None:  # before [tenant.quotas], or it would belong there
            lines.append(f"egress_allow = {json.dumps(list(tenant.egress_allow))}")
        quotas = tenant.quotas.model_dump(exclude_none=True)
        if quotas:
            lines.append("[tenant.quotas]")
            lines += [f"{quota} = {json.dumps(value)}" for quota, value in quotas.items()]
        parts.append("\n".join(lines) + "\n")
    for operator in operators or []:
        lines = ["", "[[operator]]", f"name = {json.dumps(operator.name)}"]
        lines.append(f"key_sha256 = {json.dumps(operator.key_sha256)}")
        parts.append("\n".join(lines) + "\n")
    return "".join(parts)


def _write(
    path: Path, tenants: list[TenantConfig], operators: list[OperatorConfig] | None = None
) -> None:
    # The whole file is valid before it replaces the old one.
    TenantsFile(tenant=tenants, operator=operators or [])
    text = format_tenants_file(tenants, operators)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(draft, path)
    except OSError as exc:
        raise TenantsFileError(str(path), "-", f"cannot write: {exc.strerror}") from None
    finally:
        draft.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TenantsFileError(str(path), "-", f"cannot lock: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
