"""``sandhold policy explain --backend kubernetes``: what each setting of a policy becomes on a
session Pod, read off the Pod the backend would make (pure logic: ``backend/kubernetes/explain``),
and what the cluster's options leave refused. The Pods themselves are judged on the real cluster
(tests/kubernetes)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from orchestrator.backend.kubernetes import KubernetesSettings
from orchestrator.backend.kubernetes.explain import Explained, explain_policy
from orchestrator.cli.policy import policy_app
from orchestrator.policy.model import load_policy

ENFORCING = KubernetesSettings(
    pod_pids_limit=256, network_isolated=True, seccomp_profile="localhost/sandhold.json"
)


def _rows(rows: list[Explained]) -> dict[str, Explained]:
    return {row.key: row for row in rows}


def test_a_cluster_described_as_enforcing_everything_refuses_nothing_of_the_default() -> None:
    rows = _rows(explain_policy(load_policy("default"), ENFORCING))
    assert [row.key for row in rows.values() if row.verdict == "refused"] == []
    assert rows["resources.memory_mb"].becomes.endswith("= 512Mi")
    assert "1000m" in rows["resources.cpus"].becomes
    assert "podPidsLimit (256" in rows["resources.pids"].becomes
    assert "Localhost" in rows["(seccomp)"].becomes and "every node" in rows["(seccomp)"].becomes
    assert "runAsUser 10001" in rows["(always)"].becomes
    assert "drop ALL" in rows["(always)"].becomes
    assert "sizeLimit 256Mi" in rows["resources.workspace_mb"].becomes
    assert rows["python"].verdict == "sandhold"


def test_what_the_operator_did_not_vouch_for_is_refused_with_the_reason() -> None:
    rows = _rows(explain_policy(load_policy("default"), KubernetesSettings()))
    assert rows["resources.pids"].verdict == "refused"
    assert "pod_pids_limit" in rows["resources.pids"].becomes
    assert rows["network.mode"].verdict == "refused"
    assert "network_isolated" in rows["network.mode"].becomes
    assert "RuntimeDefault" in rows["(seccomp)"].becomes


def test_pause_and_runsc_are_refused_unless_a_runtime_class_is_named() -> None:
    policy = load_policy("default").model_copy(update={"runtime": "runsc"})
    policy = policy.model_copy(
        update={"timeouts": policy.timeouts.model_copy(update={"idle_action": "pause"})}
    )
    rows = _rows(explain_policy(policy, ENFORCING))
    assert rows["timeouts.idle_action"].verdict == "refused"
    assert rows["runtime"].verdict == "refused"
    named = KubernetesSettings(pod_pids_limit=256, network_isolated=True, runtime_class="gvisor")
    assert _rows(explain_policy(policy, named))["runtime"].becomes == "runtimeClassName gvisor"


def test_the_cli_prints_the_rows_as_json_and_keeps_explain_for_code_without_the_flag() -> None:
    runner = CliRunner()
    shown = runner.invoke(
        policy_app,
        ["explain", "default", "--backend", "kubernetes", "--json", "--pod-pids-limit", "100"],
    )
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert document["backend"] == "kubernetes" and document["policy"] == "default"
    pids = [row for row in document["settings"] if row["key"] == "resources.pids"]
    assert pids[0]["verdict"] == "enforced"  # 100 <= the policy's 256
    code = runner.invoke(policy_app, ["explain", "default", "--code", "import os", "--json"])
    assert code.exit_code == 0, code.output
    assert json.loads(code.output)["decision"] in ("allowed", "denied")
    neither = runner.invoke(policy_app, ["explain", "default"])
    assert neither.exit_code == 2
