"""Reading a kubeconfig for the Kubernetes backend (``backend/kubernetes/_settings.py``; pure
logic on files): the context's cluster, user and namespace, tokens, and the refusals (no TLS
check, exec plugins, a plain-HTTP server). The real cluster's kubeconfig is read by every test
in tests/kubernetes."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from orchestrator.backend.kubernetes import KubernetesSettings
from orchestrator.backend.kubernetes._settings import connect
from orchestrator.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=test-ca", "-keyout", str(directory / "ca.key"), "-out", str(directory / "ca.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return directory / "ca.crt"


def _kubeconfig(tmp_path: Path, cluster: str, user: str, context: str = "") -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: one\n"
        f"clusters: [{{name: c, cluster: {{{cluster}}}}}]\n"
        f"users: [{{name: u, user: {{{user}}}}}]\n"
        f"contexts: [{{name: one, context: {{cluster: c, user: u{context}}}}}]\n"
    )
    return path


def test_a_token_user_and_the_contexts_namespace_are_read(tmp_path: Path, ca: Path) -> None:
    path = _kubeconfig(
        tmp_path,
        f"server: 'https://10.0.0.1:6443/', certificate-authority: '{ca}'",
        "token: abc",
        ", namespace: sandboxes",
    )
    connection = connect(KubernetesSettings(kubeconfig=path))
    assert connection.server == "https://10.0.0.1:6443"
    assert connection.headers == {"Authorization": "Bearer abc"}
    assert connection.namespace == "sandboxes"
    assert connect(KubernetesSettings(kubeconfig=path, namespace="other")).namespace == "other"


def test_embedded_certificate_data_is_read(tmp_path: Path, ca: Path) -> None:
    data = base64.b64encode(ca.read_bytes()).decode()
    path = _kubeconfig(
        tmp_path,
        f"server: 'https://k8s.example:443', certificate-authority-data: '{data}'",
        "tokenFile: token",
    )
    (tmp_path / "token").write_text("from-a-file\n")
    connection = connect(KubernetesSettings(kubeconfig=path))
    assert connection.headers == {"Authorization": "Bearer from-a-file"}
    assert connection.namespace == "default"


@pytest.mark.parametrize(
    ("cluster", "user", "refusal"),
    [
        ("server: 'https://h', insecure-skip-tls-verify: true", "token: t", "insecure"),
        ("server: 'https://h'", "exec: {command: aws}", "exec plugins"),
        ("server: 'http://h'", "token: t", "https"),
    ],
)
def test_what_sandhold_will_not_do_is_refused(
    tmp_path: Path, cluster: str, user: str, refusal: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=refusal):
        connect(KubernetesSettings(kubeconfig=_kubeconfig(tmp_path, cluster, user)))


def test_an_unknown_context_or_a_missing_file_is_named(tmp_path: Path, ca: Path) -> None:
    path = _kubeconfig(tmp_path, f"server: 'https://h', certificate-authority: '{ca}'", "token: t")
    with pytest.raises(InvalidArgumentError, match="no context named 'nope'"):
        connect(KubernetesSettings(kubeconfig=path, context="nope"))
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        connect(KubernetesSettings(kubeconfig=tmp_path / "absent"))
