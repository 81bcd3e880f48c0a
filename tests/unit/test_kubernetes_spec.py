"""The Pod of a session, from its policy (``backend/kubernetes/_spec.py``; pure logic): the
security model as Docker's ``_spec`` gives it, and every policy key a Pod cannot enforce refused
by name. The real cluster judges the rest (tests/kubernetes)."""

from __future__ import annotations

import pytest

from orchestrator.backend.base import (
    LABEL_ORCHESTRATOR,
    LABEL_SESSION,
    LABEL_TENANT,
    SANDBOX_UID,
    ContainerSpec,
)
from orchestrator.backend.kubernetes import KubernetesSettings, pod_manifest, refusals
from orchestrator.backend.kubernetes._spec import LABEL_MANAGED, pod_labels, pod_name
from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.model import Policy, load_policy

ENFORCING = KubernetesSettings(pod_pids_limit=256, network_isolated=True)


def _spec(policy: Policy | None = None, *, tenant: str = "acme") -> ContainerSpec:
    return ContainerSpec(
        image="sandhold-worker:abc",
        policy=policy or load_policy("default"),
        session_id="0123456789abcdef0123456789abcdef",
        tenant=tenant,
        orchestrator_id="sandhold-test",
    )


def _container(manifest: dict) -> dict:  # type: ignore[type-arg]
    [container] = manifest["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def test_the_pod_runs_as_the_sandbox_user_with_nothing_to_escalate_to() -> None:
    manifest = pod_manifest(_spec(), ENFORCING, annotations={})
    pod_security = manifest["spec"]["securityContext"]
    security = _container(manifest)["securityContext"]
    for context in (pod_security, security):
        assert context["runAsUser"] == context["runAsGroup"] == SANDBOX_UID
        assert context["runAsNonRoot"] is True
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_the_pod_takes_our_seccomp_profile_from_the_nodes_when_told() -> None:
    settings = KubernetesSettings(seccomp_profile="localhost/sandhold.json")
    manifest = pod_manifest(_spec(), settings, annotations={})
    expected = {"type": "Localhost", "localhostProfile": "sandhold.json"}
    assert manifest["spec"]["securityContext"]["seccompProfile"] == expected
    assert _container(manifest)["securityContext"]["seccompProfile"] == expected


def test_requests_equal_limits_and_come_from_the_policy() -> None:
    policy = load_policy("default")
    policy = policy.model_copy(
        update={"resources": policy.resources.model_copy(update={"memory_mb": 300, "cpus": 0.5})}
    )
    resources = _container(pod_manifest(_spec(policy), ENFORCING, annotations={}))["resources"]
    assert resources["requests"] == resources["limits"] == {"memory": "300Mi", "cpu": "500m"}


def test_the_writable_places_are_sized_memory_volumes_and_nothing_else_is_mounted() -> None:
    policy = load_policy("default")
    res = policy.resources
    manifest = pod_manifest(_spec(policy), ENFORCING, annotations={})
    volumes = {v["name"]: v for v in manifest["spec"]["volumes"]}
    assert {name: v["emptyDir"] for name, v in volumes.items()} == {
        "tmp": {"medium": "Memory", "sizeLimit": f"{res.tmp_mb}Mi"},
        "workspace": {"medium": "Memory", "sizeLimit": f"{res.workspace_mb}Mi"},
        "home": {"medium": "Memory", "sizeLimit": f"{res.home_mb}Mi"},
        "shm": {"medium": "Memory", "sizeLimit": f"{res.shm_mb}Mi"},
    }
    mounts = {m["mountPath"]: m["name"] for m in _container(manifest)["volumeMounts"]}
    assert mounts == {
        "/tmp": "tmp",
        "/workspace": "workspace",
        "/home/sandbox": "home",
        "/dev/shm": "shm",
    }


def test_the_pod_has_no_token_no_service_links_no_restart_and_pulls_nothing() -> None:
    manifest = pod_manifest(_spec(), ENFORCING, annotations={})
    spec = manifest["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert "runtimeClassName" not in spec
    assert _container(manifest)["imagePullPolicy"] == "Never"
    assert not any("host" in key.lower() for key in spec if key != "hostname")


def test_a_runtime_class_is_the_operators() -> None:
    settings = KubernetesSettings(runtime_class="gvisor", pod_pids_limit=256)
    assert pod_manifest(_spec(), settings, annotations={})["spec"]["runtimeClassName"] == "gvisor"


def test_labels_are_kept_whole_as_annotations_and_as_labels_where_valid() -> None:
    spec = _spec(tenant="someone@example.com")  # not a valid label value
    manifest = pod_manifest(spec, ENFORCING, annotations=spec.labels)
    assert manifest["metadata"]["annotations"] == spec.labels
    labels = manifest["metadata"]["labels"]
    assert labels[LABEL_MANAGED] == "true"
    assert labels[LABEL_SESSION] == spec.session_id
    assert labels[LABEL_ORCHESTRATOR] == "sandhold-test"
    assert LABEL_TENANT not in labels
    assert pod_labels({LABEL_SESSION: "x" * 64}) == {LABEL_MANAGED: "true"}


def test_a_pod_name_is_always_a_valid_dns_name() -> None:
    assert pod_name("0123abcd") == "sandhold-0123abcd"
    odd = pod_name("Not_A_DNS_Name" * 10)
    assert odd.startswith("sandhold-") and len(odd) <= 63 and odd == odd.lower()


def test_the_default_policy_is_refused_until_the_cluster_is_said_to_enforce_it() -> None:
    keys = [key for key, _ in refusals(_spec(), KubernetesSettings())]
    assert keys == ["resources.pids", "network.mode"]
    assert refusals(_spec(), ENFORCING) == []


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"network": {"mode": "open"}}, "network.mode"),
        ({"timeouts": {"idle_action": "pause"}}, "timeouts.idle_action"),
        ({"runtime": "runsc"}, "runtime"),
        ({"resources": {"pids": 64}}, "resources.pids"),
    ],
)
def test_a_key_the_pod_cannot_enforce_is_refused_by_name(
    change: dict[str, object], key: str
) -> None:
    data = load_policy("default").model_dump(mode="json", exclude={"extends"})
    for section, value in change.items():
        if isinstance(value, dict):
            data[section] = {**data[section], **value}
        else:
            data[section] = value
    policy = Policy.model_validate(data)
    assert [k for k, _ in refusals(_spec(policy), ENFORCING)] == [key]


def test_unknown_or_malformed_options_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="nope"):
        KubernetesSettings.from_options({"nope": 1})
    with pytest.raises(InvalidArgumentError, match="seccomp_profile"):
        KubernetesSettings.from_options({"seccomp_profile": "unconfined"})
    with pytest.raises(InvalidArgumentError, match="pod_pids_limit"):
        KubernetesSettings.from_options({"pod_pids_limit": -1})
    settings = KubernetesSettings.from_options({"namespace": "sb", "kubeconfig": "/k"})
    assert (settings.namespace, str(settings.kubeconfig)) == ("sb", "/k")
