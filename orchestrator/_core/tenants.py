"""API keys and the tenants they stand for.

Keys are never stored by the server in the clear: a tenants file lists the sha256 of each key (a
key is 256 random bits, so a fast hash is enough), and a presented key is hashed and compared in
constant time against every stored hash. Without a tenants file, ``sandhold serve`` uses one
``local`` tenant whose key is made once and kept, readable by its owner only, in the data directory,
so the person who started the server can read it again.

A tenants file::

    [[tenant]]
    name = "team-a"
    key_sha256 = "<64 hex digits: sha256 of the key>"
    policies = ["default", "strict"]     # optional: the policies this tenant may use
    [tenant.quotas]                      # optional, each key too: no key, no limit
    sessions = 10                        # sessions open at once
    memory_mb = 8192                     # sum of the sessions' memory limits
    cpus = 4.0                           # sum of the sessions' cpu limits
    terminals_per_session = 4            # lowers the policy's limit, never raises it
    processes_per_session = 8
    egress_mb = 500                      # MiB through the sessions' egress proxies, per hour
    snapshots = 20                       # snapshots kept (session snapshot)
    snapshots_mb = 2048                  # MiB of their images
    egress_allow = ["pypi.org:443", "files.pythonhosted.org:443"]
                                         # optional: the most any session may reach (below)

An operator of the server (``/metrics``, every tenant's sessions and audit records on the
operations page) has a key of its own, never a tenant's, which makes no tool calls::

    [[operator]]
    name = "ops"
    key_sha256 = "<64 hex digits>"

Without a tenants file the local key is both the ``local`` tenant and the operator: one person
runs that server.

``egress_allow`` caps every session of the tenant: a policy's allowlist keeps only what the cap
covers, an ``open`` policy becomes the cap, and a live ``set_allowlist`` stays within both.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from orchestrator._core.data_dir import data_dir as data_dir  # re-exported: the callers' old home
from orchestrator.errors import TenantsFileError
from orchestrator.policy._validation import first_problem
from orchestrator.policy.egress import check_rules

TenantName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
KeyHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]

LOCAL_TENANT = "local"
LOCAL_KEY_FILE = "api-key"
KEY_PREFIX = "sandhold_"
# 32 random bytes: a key cannot be guessed, so an unsalted sha256 of it cannot be reversed.
KEY_BYTES = 32
# A key shorter than this is not one we made; refuse it rather than trust a weak secret.
MIN_KEY_CHARS = 32
MAX_KEY_CHARS = 512


PolicyName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class TenantQuotas(BaseModel):
    """What one tenant may hold at once; None is no limit of the tenant's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sessions: int | None = Field(default=None, ge=0, le=100_000)
    memory_mb: int | None = Field(default=None, ge=0, le=1 << 30)
    cpus: float | None = Field(default=None, ge=0, le=100_000)
    terminals_per_session: int | None = Field(default=None, ge=0, le=10_000)
    processes_per_session: int | None = Field(default=None, ge=0, le=10_000)
    # Bytes both ways through the tenant's egress proxies in each hour of this orchestrator's
    # life (``_core.egress_meter``); over it, the proxies refuse and close with tenant.egress_mb.
    egress_mb: int | None = Field(default=None, ge=0, le=1 << 30)
    # Snapshots kept (``_core.snapshots``): how many, and the MiB of their images (each counted
    # as what it adds to its template's image: the commit and the archive of its files).
    snapshots: int | None = Field(default=None, ge=0, le=10_000)
    snapshots_mb: int | None = Field(default=None, ge=0, le=1 << 30)


class TenantConfig(BaseModel):
    """One ``[[tenant]]`` of a tenants file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TenantName
    key_sha256: KeyHash
    # None: every policy the server can load.
    policies: tuple[PolicyName, ...] | None = None
    quotas: TenantQuotas = TenantQuotas()
    # None: what each policy allows. Else the most any of the tenant's sessions may reach.
    egress_allow: tuple[str, ...] | None = None

    @field_validator("egress_allow")
    @classmethod
    def _rules(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(dict.fromkeys(check_rules(value)))


class OperatorConfig(BaseModel):
    """One ``[[operator]]`` of a tenants file: a key for the whole server's figures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TenantName
    key_sha256: KeyHash


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: list[TenantConfig] = Field(min_length=1)
    operator: list[OperatorConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        names = [t.name for t in self.tenant] + [o.name for o in self.operator]
        hashes = [t.key_sha256 for t in self.tenant] + [o.key_sha256 for o in self.operator]
        if len(set(names)) != len(names):
            raise ValueError("tenant and operator names must be unique")
        if len(set(hashes)) != len(hashes):
            raise ValueError("a key may belong to one tenant only")
        return self


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


class TenantKeys:
    """Which tenant a presented API key belongs to."""

    def __init__(
        self,
        tenants: Iterable[TenantConfig],
        operators: Iterable[OperatorConfig] = (),
        *,
        local_operator: bool = False,
    ) -> None:
        self.tenants = {t.name: t for t in tenants}
        self.operators = {o.name: o for o in operators}
        # (hash, name, tenant or None, operator): one row per key.
        self._hashes: list[tuple[bytes, str, str | None, bool]] = [
            (bytes.fromhex(t.key_sha256), t.name, t.name, local_operator)
            for t in self.tenants.values()
        ] + [(bytes.fromhex(o.key_sha256), o.name, None, True) for o in self.operators.values()]

    def replace_with(self, other: TenantKeys) -> None:
        """Take ``other``'s tenants and keys (a reload): one assignment, so a request sees the
        old set or the new one, never a mix."""
        self.tenants, self.operators, self._hashes = other.tenants, other.operators, other._hashes

    @classmethod
    def from_file(cls, path: Path) -> TenantKeys:
        loaded = load_tenants_file(path)
        return cls(loaded.tenant, loaded.operator)

    @classmethod
    def single(cls, name: str, key: str, *, operator: bool = False) -> TenantKeys:
        """One tenant's key; ``operator``: the key is the server's operator too."""
        return cls([TenantConfig(name=name, key_sha256=hash_key(key))], local_operator=operator)

    def tenant_for(self, key: str) -> str | None:
        """The tenant of ``key``, or None (an operator's key is no tenant's)."""
        found = self.role_for(key)
        return found[1] if found is not None else None

    def role_for(self, key: str) -> tuple[str, str | None, bool] | None:
        """Whose ``key`` is: its name, the tenant it is (None: an operator only) and whether
        it is an operator's; None for no one's. Every stored hash is compared, each in
        constant time, so the answer's timing tells nothing about which hash came close."""
        if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
            return None
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found = None
        for stored, name, tenant, operator in self._hashes:
            if hmac.compare_digest(digest, stored):
                found = (name, tenant, operator)
        return found


def load_tenants_file(path: Path) -> TenantsFile:
    try:
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise TenantsFileError(str(path), "-", "file not found") from None
    except OSError as exc:
        raise TenantsFileError(str(path), "-", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TenantsFileError(str(path), "-", f"not valid TOML: {exc}") from None
    try:
        return TenantsFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise TenantsFileError(str(path), *first_problem(exc)) from None


def local_key(directory: Path) -> tuple[str, bool]:
    """The local tenant's key from ``directory``, made (mode 0600) if there is none yet; and
    whether this call made it."""
    path = directory / LOCAL_KEY_FILE
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists():
            return _read_local_key(path), False
        key = new_key()
        # Written whole under a private name, then linked into place: a second server starting
        # at the same moment either wins the link or reads a complete key, never half of one.
        draft = directory / f".{LOCAL_KEY_FILE}.{secrets.token_hex(8)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(key + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.link(draft, path)
        finally:
            draft.unlink(missing_ok=True)
    except FileExistsError:
        return _read_local_key(path), False
    except OSError as exc:
        raise TenantsFileError(str(path), "-", f"cannot create: {exc.strerror}") from None
    return key, True


def _read_local_key(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = handle.read(MAX_KEY_CHARS + 2)
    except OSError as exc:
        raise TenantsFileError(str(path), "-", f"cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(mode) or mode & 0o077:
        raise TenantsFileError(str(path), "-", "must be a regular file readable by its owner only")
    key = data.decode("ascii", "replace").strip()
    if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS or not key.isprintable() or " " in key:
        raise TenantsFileError(str(path), "-", "does not hold a valid key (remove it to make one)")
    return key


def local_tenant(directory: Path | None = None) -> tuple[TenantKeys, str, bool]:
    """The keys of the single local tenant, its key, and whether the key was just made."""
    key, created = local_key(directory or data_dir())
    return TenantKeys.single(LOCAL_TENANT, key, operator=True), key, created
