"""``sandhold policy check``: validate a policy and show its effective settings; ``test``,
``explain`` and ``diff`` live in ``policy_test``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli._common import reported_errors, stdout
from orchestrator.cli.policy_test import policy_diff, policy_explain, policy_test

if TYPE_CHECKING:
    from orchestrator.policy.model import Policy

__all__ = ["policy_app", "policy_check"]

policy_app = typer.Typer(help="Inspect, test and compare policies.", no_args_is_help=True)
policy_app.command("test")(policy_test)
policy_app.command("explain")(policy_explain)
policy_app.command("diff")(policy_diff)


@policy_app.command("check")
def policy_check(
    policy: Annotated[str, typer.Argument(help="A shipped policy name or a policy file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Validate a policy and print the effective settings and their hash."""
    from orchestrator.policy.model import load_policy

    with reported_errors():
        loaded = load_policy(policy)
    if as_json:
        document = {"name": loaded.name, "hash": loaded.hash, "policy": _effective(loaded)}
        stdout.print(json.dumps(document, indent=2), markup=False)
    else:
        stdout.print("\n".join(_toml_lines(loaded)), markup=False)


def _effective(policy: Policy) -> dict[str, Any]:
    return policy.model_dump(mode="json", exclude={"extends"})


def _toml_lines(policy: Policy) -> list[str]:
    # JSON scalars and arrays are valid TOML values; unset (None) settings are left out.
    data = _effective(policy)
    lines = [f"# effective policy {policy.name!r}", f"# hash = {policy.hash}"]
    tables = {key: value for key, value in data.items() if isinstance(value, dict)}
    lines += [
        f"{k} = {json.dumps(v)}" for k, v in data.items() if k not in tables and v is not None
    ]
    for name, table in tables.items():
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items() if v is not None]
    return lines
