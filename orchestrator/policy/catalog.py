"""The policies an orchestrator serves, read whole when it starts and when it reloads (SIGHUP).

Invariant: a request names a policy, and a name is only ever looked up here. ``get`` checks the
name's form before anything else and then reads a dictionary: no caller's argument reaches the
filesystem, so a path, a FIFO, ``/dev/zero`` or ``../`` can neither be opened nor probed (they
all answer the one error of a malformed name). Files are read only by ``load``, from the
operator's directories and the shipped ones, at start or reload.

A file that fails to load is kept as its error: asking for that name raises it (the operator's
mistake, named with its file and key), and the other policies keep working.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator._resources import shipped_policies_dir
from orchestrator.errors import InvalidArgumentError, UnknownPolicyError
from orchestrator.policy.arguments import check_policy_name
from orchestrator.policy.model import Policy, load_policy

__all__ = ["PolicyCatalog"]


@dataclass(frozen=True)
class PolicyCatalog:
    """Loaded policies by name, and the default one; ``broken`` holds the error of each file
    that did not load."""

    policies: Mapping[str, Policy]
    default: Policy
    broken: Mapping[str, InvalidArgumentError] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        search_dirs: Sequence[Path] = (),
        *,
        default: str | Path = "default",
        templates: Collection[str] | None = None,
    ) -> PolicyCatalog:
        """Every ``NAME.toml`` of ``search_dirs`` and the shipped directory (the first of a
        name wins, as ``load_policy`` looks names up), each loaded with its ``extends`` chain.
        ``default`` is a name, or the operator's own file (``serve --policy FILE``), which
        must load."""
        policies: dict[str, Policy] = {}
        broken: dict[str, InvalidArgumentError] = {}
        for name in _names(search_dirs):
            try:
                policies[name] = load_policy(name, search_dirs=search_dirs, templates=templates)
            except InvalidArgumentError as exc:  # PolicyFileError, UnknownTemplateError
                broken[name] = exc
        if isinstance(default, str) and _is_name(default):
            chosen = _lookup(policies, broken, default)
        else:
            chosen = load_policy(default, search_dirs=search_dirs, templates=templates)
        return cls(policies, chosen, broken)

    def names(self) -> list[str]:
        return sorted(self.policies)

    def get(self, name: Any) -> Policy:
        """The policy of that name (None: the default): the one check every interface and
        operation goes through."""
        if name is None:
            return self.default
        checked = check_policy_name(name)
        if checked is None:
            raise InvalidArgumentError("policy must be the name of a policy")
        return _lookup(self.policies, self.broken, checked)

    def require(self, names: Collection[str]) -> None:
        """Raise the first load error among ``names`` (the pools'): those must load for a start
        or a reload to be taken."""
        for name in sorted(names):
            self.get(name)


def _lookup(
    policies: Mapping[str, Policy], broken: Mapping[str, InvalidArgumentError], name: str
) -> Policy:
    if name in policies:
        return policies[name]
    if name in broken:
        raise broken[name]
    raise UnknownPolicyError(f"unknown policy {name!r}")


def _names(search_dirs: Sequence[Path]) -> list[str]:
    found: list[str] = []
    for directory in [*search_dirs, shipped_policies_dir()]:
        try:
            files = sorted(directory.glob("*.toml"))
        except OSError:
            continue
        for file in files:
            # A name that no request could ask for is not served (nor read).
            if file.is_file() and _is_name(file.stem) and file.stem not in found:
                found.append(file.stem)
    return found


def _is_name(text: str) -> bool:
    try:
        return check_policy_name(text) is not None
    except InvalidArgumentError:
        return False
