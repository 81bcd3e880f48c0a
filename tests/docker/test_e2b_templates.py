"""E2B's template build API driven by E2B's own SDK against a real ``sandhold serve
--e2b-port``, each build a real sandhold template build (network off, over the worker image):
``run_cmd`` (also as another user), symlinks, envs, ``copy`` of uploaded files, tags,
``Template.exists``, background builds whose status and logs are polled, a sandbox made from a
build (its tenant's only); and what cannot be built refused clearly: an image sandhold does not
have (never pulled), ``pip_install`` from an index, a failing command (its output in the logs),
too many steps. Builds are a few small
layers over ``base``, cached by their inputs: a rerun of the module rebuilds nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import (
    BuildException,
    CommandExitException,
    LogEntry,
    Sandbox,
    SandboxException,
    Template,
)

from orchestrator.http.e2b._templates import MAX_STEPS
from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

pytestmark = pytest.mark.docker

# An upper bound on a background build's wait (a loaded machine builds slowly).
BUILD_WAIT = 600.0


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-templates")) as running:
        yield running


def test_steps_build_a_template_that_then_exists_with_its_logs(
    server: E2bServer, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text("hello from the host\n")
    (tmp_path / "data" / "link.txt").symlink_to("hello.txt")  # a link stays a link
    (tmp_path / "data" / "away.txt").symlink_to("/etc/hostname")  # even one leaving the upload
    template = (
        Template(file_context_path=str(tmp_path))
        .from_template("base")
        .set_envs({"GREETING": "hi there"})
        .copy("data/hello.txt", "/opt/e2b/hello.txt")
        .run_cmd('test "$(cat /opt/e2b/hello.txt)" = "hello from the host"')
        .copy("data/*", "all", user="sandbox")  # a glob, into a folder of the working directory
        .run_cmd(
            'test "$(readlink all/link.txt)" = hello.txt && test "$(cat all/link.txt)" = '
            '"hello from the host" && test "$(readlink all/away.txt)" = /etc/hostname && '
            'test "$(stat -c %U all/hello.txt)" = sandbox'
        )
        .run_cmd('test "$(id -u)" = 0')  # steps run as root unless told
        .run_cmd('test "$(id -un)" = sandbox && test "$GREETING" = "hi there"', user="sandbox")
        .make_symlink("/opt/e2b/hello.txt", "/opt/e2b/link.txt")
        .run_cmd('test "$(readlink /opt/e2b/link.txt)" = /opt/e2b/hello.txt')
    )
    assert not Template.exists("steps")
    logs: list[LogEntry] = []
    built = Template.build(template, "steps", tags=["v1"], on_build_logs=logs.append)
    assert built.tags == ["v1"]
    assert Template.exists("steps")
    assert not Template.exists("never-built")
    assert Template.exists("base")  # this server's own
    said = [entry.message for entry in logs]
    assert any("[sandhold] building steps over base" in line for line in said), said
    assert any(line.endswith("ready") for line in said), said
    # The same steps again: every layer is current, nothing is built.
    again: list[LogEntry] = []
    Template.build(template, "steps", tags=["v2"], on_build_logs=again.append)
    assert any("is current" in entry.message for entry in again)
    assert {t.tag for t in Template.get_tags(built.template_id)} >= {"v1", "v2"}


def test_a_background_build_is_polled_to_ready(server: E2bServer) -> None:
    template = Template().from_base_image().run_cmd("echo polled > /tmp/polled")
    info = Template.build_in_background(template, "polled")
    deadline = time.monotonic() + BUILD_WAIT
    seen: list[str] = []
    while True:
        status = Template.get_build_status(info, logs_offset=len(seen))
        seen += [entry.message for entry in status.log_entries]
        if status.status.value in ("ready", "error") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status.status.value == "ready", (status.reason, seen)
    assert any("[sandhold]" in line for line in seen)


def test_apt_install_is_a_layer_of_debian_packages_fetched_on_the_host(server: E2bServer) -> None:
    template = Template().from_template("base").apt_install("jq").run_cmd("jq --version")
    logs: list[LogEntry] = []
    Template.build(template, "with-jq", on_build_logs=logs.append)
    assert Template.exists("with-jq")
    assert any("jq" in entry.message for entry in logs)


@pytest.mark.parametrize(
    ("template", "refusal"),
    [
        (Template().from_image("ubuntu:22.04").run_cmd("true"), "sandhold pulls no images"),
        (Template().from_template("base").pip_install("requests"), "installs from an index"),
        (Template().from_template("base").run_cmd("echo broken-step >&2; exit 3"), "exit"),
        (Template().from_template("base").run_cmd("true", user="root 1"), "not a user name"),
    ],
)
def test_what_cannot_be_built_fails_with_a_clear_error(
    server: E2bServer, template: Template, refusal: str
) -> None:
    with pytest.raises(BuildException, match=refusal):
        Template.build(template, "refused")
    assert not Template.exists("refused")


def test_a_build_has_at_most_its_steps(server: E2bServer) -> None:
    template = Template().from_template("base")
    for index in range(MAX_STEPS + 1):
        template = template.run_cmd(f"echo {index}")
    with pytest.raises(BuildException, match="template_steps"):
        Template.build(template, "too-long")


def test_one_tenants_uploads_serve_no_other_tenants_build(server: E2bServer) -> None:
    """What the SDK would never send, sent by hand: team-b names the files team-a uploaded."""
    import io
    import tarfile

    import httpx

    files_hash = "b" * 64
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        info = tarfile.TarInfo("secret.txt")
        info.size = 6
        archive.addfile(info, io.BytesIO(b"secret"))
    copy = {"type": "COPY", "args": ["secret.txt", "/opt/secret.txt"], "filesHash": files_hash}
    answers = {}
    for tenant in ("team-a", "team-b"):
        with httpx.Client(headers={"X-API-Key": server.keys[tenant]}, timeout=60) as http:
            made = http.post(f"{server.url}/v3/templates", json={"name": "uploads"}).json()
            link = http.get(f"{server.url}/templates/{made['templateID']}/files/{files_hash}")
            answers[tenant] = link.json()
            if tenant == "team-a":
                assert httpx.put(link.json()["url"], content=data.getvalue()).status_code == 200
                continue
            started = http.post(
                f"{server.url}/v2/templates/{made['templateID']}/builds/{made['buildID']}",
                json={"fromTemplate": "base", "steps": [copy]},
            )
            assert started.status_code == 400, started.text
            assert "template_files" in started.json()["message"]
    assert answers["team-a"]["present"] is False and answers["team-b"]["present"] is False


def test_a_sandbox_is_made_from_a_build_of_its_own_tenant_only(server: E2bServer) -> None:
    """The apt test's steps again (its layers are current: no build), under another name: a
    sandbox of it has jq, which the base template lacks; team-b's create of the name is E2B's
    404, as for a name never built."""
    template = Template().from_template("base").apt_install("jq").run_cmd("jq --version")
    built = Template.build(template, "jq-sandbox")
    Template.assign_tags("jq-sandbox", "v1")
    for name in ("jq-sandbox", "jq-sandbox:v1", built.template_id):
        sandbox = Sandbox.create(name)
        try:
            ran = sandbox.commands.run("jq -n '[1, 2] | add'")
            assert (ran.exit_code, ran.stdout.strip()) == (0, "3")
            assert sandbox.get_info().template_id == name
        finally:
            sandbox.kill()
    # The build's image is not the base template's.
    with Sandbox.create("base") as plain, pytest.raises(CommandExitException):
        plain.commands.run("command -v jq")
    for name in ("jq-sandbox", built.template_id, "never-built"):
        with pytest.raises(SandboxException, match="404"):
            Sandbox.create(name, api_key=server.keys["team-b"])
