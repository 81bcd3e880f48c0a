"""``sandhold policy check``: validate a policy and show its effective settings; ``test``,
``explain`` and ``diff`` live in ``policy_test``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from orchestrator.cli._common import reported_errors, stdout
from orchestrator.cli.policy_test import policy_diff, policy_explain, policy_test

if TYPE_CHECKING:
    from orchestrator.policy.model import Policy

__all__ = ["policy_app", "policy_check", "policy_explain_on"]

policy_app = typer.Typer(help="Inspect, test and compare policies.", no_args_is_help=True)
policy_app.command("test")(policy_test)
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


@policy_app.command("explain")
def policy_explain_on(
    policy: Annotated[str, typer.Argument(help="A policy name or a policy file.")],
    code: Annotated[
        str | None, typer.Option("--code", help="Python code ('-' reads standard input).")
    ] = None,
    command: Annotated[str | None, typer.Option("--command", help="A shell command line.")] = None,
    confirm_dangerous: Annotated[
        bool, typer.Option("--confirm-dangerous", help="As the tools' confirm_dangerous.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    backend: Annotated[
        Literal["docker", "kubernetes"] | None,
        typer.Option(
            "--backend",
            help="kubernetes: what each setting becomes on a session Pod, and what is refused "
            "(with the options below, as given to serve).",
        ),
    ] = None,
    seccomp_profile: Annotated[
        str, typer.Option(help="Kubernetes: localhost/<file> or RuntimeDefault.")
    ] = "RuntimeDefault",
    pod_pids_limit: Annotated[
        int | None, typer.Option(min=1, help="Kubernetes: the nodes' kubelet podPidsLimit.")
    ] = None,
    network_isolated: Annotated[
        bool, typer.Option("--network-isolated", help="Kubernetes: Pods' network reaches nothing.")
    ] = False,
    runtime_class: Annotated[
        str | None, typer.Option(help="Kubernetes: the RuntimeClass of session Pods.")
    ] = None,
) -> None:
    """Which rule would decide some code or a command, and why, without running anything; with
    --backend kubernetes, what each setting of the policy becomes on a Pod."""
    if backend != "kubernetes":
        policy_explain(policy, code, command, confirm_dangerous, as_json)
        return
    from orchestrator.backend.kubernetes import KubernetesSettings
    from orchestrator.backend.kubernetes.explain import explain_policy
    from orchestrator.policy.model import load_policy

    with reported_errors():
        loaded = load_policy(policy)
        options: dict[str, Any] = {
            "seccomp_profile": seccomp_profile,
            "network_isolated": network_isolated,
        }
        if pod_pids_limit is not None:
            options["pod_pids_limit"] = pod_pids_limit
        if runtime_class is not None:
            options["runtime_class"] = runtime_class
        rows = explain_policy(loaded, KubernetesSettings.from_options(options))
    if as_json:
        document = {
            "policy": loaded.name,
            "hash": loaded.hash,
            "backend": "kubernetes",
            "settings": [row.to_dict() for row in rows],
        }
        stdout.print(json.dumps(document, indent=2), markup=False)
        return
    from rich.table import Table

    table = Table(title=f"policy {loaded.name!r} (hash {loaded.hash[:12]}) on kubernetes")
    for column in ("key", "value", "on the Pod", "verdict"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.key, row.value, row.becomes, row.verdict)
    stdout.print(table)
