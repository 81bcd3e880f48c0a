"""Building the sandbox images against a real engine, and the `sandhold image` and `sandhold
policy` commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest

from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.backend.docker import DockerClient
from orchestrator.errors import BackendUnavailableError, ImageError, ImageToolMissingError
from orchestrator.images import ImageBuildResult, NullProgress, ensure_worker_image
from orchestrator.images._cache import build_lock
from orchestrator.images.base import local_image_id
from orchestrator.images.debootstrap import build_base_image, mounts_under, remove_workdir
from orchestrator.images.wheels import IMAGE_BUILD_LABEL, probe_python
from orchestrator.policy.model import load_policy
from tests.conftest import RUN_ID, TEST_RUN_LABEL

pytestmark = pytest.mark.docker

# A warm ensure_worker_image is a few engine calls and file reads.
WARM_TIMEOUT = 60.0
# The CLI subprocess: interpreter start-up plus a warm ensure.
CLI_TIMEOUT = 120.0
UNREACHABLE = "unix:///nonexistent.sock"
# A small build on a slow storage driver: a few seconds per instruction.
BUILD_TIMEOUT = 300.0

needs_root_and_debootstrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("debootstrap") is None,
    reason="needs root and debootstrap",
)


class RecordingProgress:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.steps: list[str] = []

    def step(self, name: str) -> None:
        self.steps.append(name)

    def log(self, line: str) -> None:
        self.lines.append(line)

    def done(self, name: str) -> None:
        pass


def _sandhold(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.anyio
async def test_a_second_ensure_returns_the_same_tag_without_building(
    docker_client: DockerClient, worker_image: ImageBuildResult
) -> None:
    progress = RecordingProgress()
    with anyio.fail_after(WARM_TIMEOUT):
        again = await ensure_worker_image(
            docker_client, base_image=worker_image.base_image, progress=progress
        )
    assert again == ImageBuildResult(worker_image.tag, False, worker_image.base_image)
    assert progress.steps == ["base image", "python in base", "psutil wheels", "worker image"]


@pytest.mark.anyio
async def test_the_worker_image_imports_psutil_as_the_sandbox_user_without_network(
    docker_client: DockerClient, worker_image: ImageBuildResult
) -> None:
    labels = {LABEL_ORCHESTRATOR: IMAGE_BUILD_LABEL, TEST_RUN_LABEL: RUN_ID}
    code = "import os, psutil; print(os.getuid(), psutil.__version__)"
    with anyio.fail_after(WARM_TIMEOUT):
        output = await docker_client.call(
            lambda sdk: sdk.containers.run(
                worker_image.tag,
                ["python3", "-c", code],
                user="10001",
                network_mode="none",
                labels=labels,
                remove=True,
            )
        )
    uid, version = output.decode().split()
    assert uid == "10001"
    assert version


@pytest.mark.anyio
async def test_an_unpullable_base_image_falls_back_to_the_debootstrapped_base(
    docker_client: DockerClient, worker_image: ImageBuildResult
) -> None:
    if not worker_image.base_image.startswith("sandhold-base:"):
        pytest.skip("this run's worker image is built on a given base, not on sandhold-base")
    # sandhold-base:<suite>-<packages>: a Debian codename has no hyphen of its own.
    suite = worker_image.base_image.removeprefix("sandhold-base:").split("-")[0]
    progress = RecordingProgress()
    with anyio.fail_after(WARM_TIMEOUT):
        result = await ensure_worker_image(
            docker_client,
            base_image="sandhold-test.invalid/nosuch:1",
            suite=suite,
            progress=progress,
        )
    assert result == ImageBuildResult(worker_image.tag, False, worker_image.base_image)
    assert any("could not pull" in line for line in progress.lines)


@pytest.mark.anyio
async def test_the_python_probe_leaves_no_container_behind(
    docker_client: DockerClient,
    worker_image: ImageBuildResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    label = f"{LABEL_ORCHESTRATOR}={IMAGE_BUILD_LABEL}"
    with anyio.fail_after(WARM_TIMEOUT):
        image_id = await local_image_id(docker_client, worker_image.base_image)
        assert image_id is not None
        target = await probe_python(docker_client, image_id)
        left = await docker_client.call(
            lambda sdk: sdk.containers.list(all=True, filters={"label": label})
        )
    assert target.version.startswith("3.")
    assert left == []
    assert list((tmp_path / "sandhold" / "python-probe").glob("*.json"))


@pytest.mark.anyio
@pytest.mark.skipif(os.geteuid() != 0, reason="without root the error is 'needs root'")
async def test_a_missing_debootstrap_names_the_package_to_install(
    docker_client: DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SANDHOLD_BASE_IMAGE", raising=False)
    monkeypatch.delenv("BASE_IMAGE", raising=False)
    with anyio.fail_after(WARM_TIMEOUT), pytest.raises(ImageToolMissingError) as caught:
        await ensure_worker_image(docker_client, suite="sandhold-test-nosuch")
    assert caught.value.code == "invalid_argument"
    assert "debootstrap" in str(caught.value)


@pytest.mark.anyio
async def test_an_unreachable_engine_is_backend_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", UNREACHABLE)
    client = DockerClient()
    try:
        with anyio.fail_after(WARM_TIMEOUT), pytest.raises(BackendUnavailableError) as caught:
            await ensure_worker_image(client)
    finally:
        await client.aclose()
    assert caught.value.code == "backend_unavailable"


def test_sandhold_image_build_prints_the_tag(worker_image: ImageBuildResult) -> None:
    result = _sandhold("image", "build", "--base-image", worker_image.base_image)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == worker_image.tag


def test_sandhold_image_build_with_an_unreachable_engine_exits_2_on_one_line() -> None:
    result = _sandhold("image", "build", env={"DOCKER_HOST": UNREACHABLE})
    assert result.returncode == 2
    assert result.stderr.startswith("error: backend_unavailable: ")
    assert result.stderr.count("\n") == 1
    assert "DOCKER_HOST" in result.stderr


def test_sandhold_policy_check_prints_the_policy_hash() -> None:
    result = _sandhold("policy", "check", "default")
    assert result.returncode == 0, result.stderr
    assert load_policy("default").hash in result.stdout


def test_sandhold_policy_check_json_carries_the_hash() -> None:
    result = _sandhold("policy", "check", "strict", "--json")
    assert result.returncode == 0, result.stderr
    assert f'"hash": "{load_policy("strict").hash}"' in result.stdout


def test_sandhold_policy_check_of_a_broken_file_exits_2_naming_the_key(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('extends = "default"\n[resources]\nmemory_mb = "lots"\n')
    result = _sandhold("policy", "check", str(broken))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: invalid_argument: {broken}: resources.memory_mb: ")
    assert result.stderr.count("\n") == 1


@pytest.mark.anyio
async def test_without_root_the_debootstrap_base_is_refused_naming_the_command_that_fixes_it(
    docker_client: DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("SANDHOLD_BASE_IMAGE", raising=False)
    monkeypatch.delenv("BASE_IMAGE", raising=False)
    with anyio.fail_after(WARM_TIMEOUT), pytest.raises(ImageToolMissingError) as caught:
        await ensure_worker_image(docker_client, suite="sandhold-test-nosuch")
    assert caught.value.code == "invalid_argument"
    assert "sudo sandhold image build" in (caught.value.hint or "")


@pytest.mark.anyio
@needs_root_and_debootstrap
async def test_a_failing_debootstrap_leaves_no_work_directory_behind(
    docker_client: DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with anyio.fail_after(WARM_TIMEOUT), pytest.raises(ImageError) as caught:
        await build_base_image(docker_client, suite="sandhold-test-nosuch", progress=NullProgress())
    assert caught.value.code == "internal"
    assert [entry async for entry in anyio.Path(tmp_path).iterdir()] == []


@needs_root_and_debootstrap
def test_removing_a_work_directory_unmounts_first_and_never_deletes_through_a_mount(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    workdir = tmp_path / "work"
    target = workdir / "rootfs" / "dev"
    target.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(outside), str(target)], check=True, timeout=30)
    try:
        assert mounts_under(workdir) == [str(target)]
        assert remove_workdir(workdir) is None
    finally:
        if mounts_under(workdir):
            subprocess.run(["umount", "-l", str(target)], check=False, timeout=30)
    assert not workdir.exists()
    assert (outside / "keep").read_text() == "host file"


@pytest.mark.anyio
async def test_a_second_build_of_the_same_image_waits_for_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    progress = RecordingProgress()
    async with build_lock("base-test", timeout=WARM_TIMEOUT, progress=progress):
        with pytest.raises(ImageError):
            async with build_lock("base-test", timeout=0.2, progress=progress):
                pass
    async with build_lock("base-test", timeout=WARM_TIMEOUT, progress=progress):
        pass
    assert sum("waiting for another build" in line for line in progress.lines) == 1


@pytest.mark.anyio
async def test_a_failing_build_raises_an_image_error_with_the_last_build_lines(
    docker_client: DockerClient,
    worker_image: ImageBuildResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dockerfile = tmp_path / "Dockerfile.worker"
    dockerfile.write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo sandhold-test-marker && exit 3\n"
    )
    monkeypatch.setattr("orchestrator.images.worker.worker_dockerfile", lambda: dockerfile)
    with anyio.fail_after(BUILD_TIMEOUT), pytest.raises(ImageError) as caught:
        await ensure_worker_image(docker_client, base_image=worker_image.base_image)
    assert type(caught.value) is ImageError
    assert "sandhold-test-marker" in (caught.value.hint or "")
