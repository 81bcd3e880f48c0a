"""``sandhold tenant add | rotate | list``: the tenants file that ``sandhold serve`` reads
(``--tenants``, default ``tenants.toml`` in the data directory, which serve then reads by
default). A new key is printed once, alone on stdout (so ``KEY=$(sandhold tenant add x)``
works); the file keeps only its sha256. A running server picks changes up on SIGHUP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator._core import TENANTS_FILE, data_dir
from orchestrator.cli._common import reported_errors, stdout
from orchestrator.errors import InvalidArgumentError

__all__ = ["default_tenants_file", "tenant_app"]

tenant_app = typer.Typer(
    help="Tenants and their API keys, in the tenants file serve reads.", no_args_is_help=True
)

TenantsOption = Annotated[
    Path | None,
    typer.Option(
        "--tenants", help=f"The tenants file; default: {TENANTS_FILE} in the data directory."
    ),
]


def default_tenants_file() -> Path:
    return data_dir() / TENANTS_FILE


@tenant_app.command("add")
def tenant_add(
    name: Annotated[str, typer.Argument(help="The tenant's name (a-z, 0-9, _.-).")],
    policies: Annotated[
        str | None,
        typer.Option(help="Comma-separated policies the tenant may use; default: any."),
    ] = None,
    quota: Annotated[
        list[str] | None,
        typer.Option(
            help="A quota as name=value (sessions, memory_mb, cpus, terminals_per_session, "
            "processes_per_session, egress_mb); repeatable."
        ),
    ] = None,
    egress_allow: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated hosts (policy allow rules) the most any of the tenant's "
            "sessions may reach; default: what each policy allows."
        ),
    ] = None,
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="An operator of the server, not a tenant: its key reads /metrics and every "
            "tenant's sessions and audit records (/ui), and makes no tool calls.",
        ),
    ] = False,
    tenants: TenantsOption = None,
) -> None:
    """Add a tenant (or, with --operator, an operator) with a new API key, printed once."""
    from orchestrator._core import add_operator, add_tenant, parse_quotas

    path = tenants or default_tenants_file()
    if operator:
        if policies is not None or quota or egress_allow is not None:
            raise typer.BadParameter("an operator has no policies, quotas or egress cap")
        with reported_errors():
            key = add_operator(path, name)
        typer.echo(
            f"sandhold: operator {name!r} added to {path}; its API key (shown once):", err=True
        )
        typer.echo(key)
        return
    with reported_errors():
        allowed = _policies(policies)
        cap = None
        if egress_allow is not None:
            cap = tuple(rule.strip() for rule in egress_allow.split(",") if rule.strip())
        key = add_tenant(
            path, name, policies=allowed, quotas=parse_quotas(quota or []), egress_allow=cap
        )
    typer.echo(f"sandhold: tenant {name!r} added to {path}; its API key (shown once):", err=True)
    typer.echo(key)


@tenant_app.command("rotate")
def tenant_rotate(
    name: Annotated[str, typer.Argument(help="The tenant whose key to replace.")],
    tenants: TenantsOption = None,
) -> None:
    """Give a tenant (or an operator) a new API key, printed once; the old one stops working
    once serve reloads (SIGHUP) or restarts."""
    from orchestrator._core import rotate_key

    path = tenants or default_tenants_file()
    with reported_errors():
        key = rotate_key(path, name)
    typer.echo(f"sandhold: tenant {name!r} has a new API key (shown once):", err=True)
    typer.echo(key)


@tenant_app.command("list")
def tenant_list(
    tenants: TenantsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The tenants: names, policies, quotas and egress caps (never keys); and the operators."""
    from orchestrator._core import read_operators, read_tenants

    path = tenants or default_tenants_file()
    with reported_errors():
        found = read_tenants(path)
        operators = [o.name for o in read_operators(path)]
    rows: list[dict[str, Any]] = [
        {
            "name": t.name,
            "policies": None if t.policies is None else list(t.policies),
            "quotas": t.quotas.model_dump(exclude_none=True),
            "egress_allow": None if t.egress_allow is None else list(t.egress_allow),
        }
        for t in found
    ]
    if as_json:
        # Operators are rows too, marked as such (a tenant row has no "operator" key).
        listed = rows + [{"name": name, "operator": True} for name in operators]
        stdout.print(json.dumps(listed, indent=2), markup=False)
        return
    for row in rows:
        allowed = "any" if row["policies"] is None else ",".join(row["policies"]) or "none"
        quotas = " ".join(f"{k}={v}" for k, v in row["quotas"].items()) or "-"
        rules = row["egress_allow"]
        cap = "" if rules is None else "\tegress_allow=" + ",".join(rules)
        stdout.print(f"{row['name']}\tpolicies={allowed}\tquotas: {quotas}{cap}", markup=False)
    for name in operators:
        stdout.print(f"{name}\toperator", markup=False)


def _policies(text: str | None) -> tuple[str, ...] | None:
    """The policy names, each loaded once so that a typo is refused here, not at a create."""
    from orchestrator.policy.model import load_policy

    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise InvalidArgumentError("--policies: name at least one policy")
    for name in names:
        load_policy(name)
    return names
