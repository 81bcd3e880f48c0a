"""Image templates against the real engine: python-data built offline and used by a policy,
matplotlib drawing text without a GUI or a font warning, a user template of one pinned wheel,
a user Dockerfile that sees no network while it builds, the list, prune's decisions on template
images (dry runs: the repository holds other people's images), unknown templates refused, and
warm preload in pooled sessions, restricted ones still refused by name.

The python-data image is built once per run (an unchanged one is found current) from the wheel
cache, so a warm run downloads nothing."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.errors import UnknownTemplateError
from orchestrator.images import ImageBuildResult, NullProgress
from orchestrator.images.prune import prune_worker_images
from orchestrator.images.template_build import (
    TemplateImage,
    ensure_template_image,
    template_hashes,
    template_tag,
)
from orchestrator.images.templates import BASE, load_catalog
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# A cold build downloads ~90 MB of wheels and installs them; a warm one finds the image current.
BUILD_TIMEOUT = 1500
CLI_TIMEOUT = 300
SIX = "six==1.17.0 --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def python_data(worker_image: ImageBuildResult) -> TemplateImage:
    client = DockerClient()
    try:
        with anyio.fail_after(BUILD_TIMEOUT):
            return await ensure_template_image(
                client, load_catalog(), "python-data", base_tag=worker_image.tag,
                progress=NullProgress(),
            )  # fmt: skip
    finally:
        await client.aclose()


@pytest.fixture
def template_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "templates"
    directory.mkdir()
    return directory


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    return directory


@pytest.fixture
async def made_images(docker_client: DockerClient) -> AsyncIterator[list[str]]:
    """Tags of user templates this test built, removed at the end (never a shipped one)."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        with contextlib.suppress(NotFoundError):
            await docker_client.call(lambda sdk, t=tag: sdk.api.remove_image(t))


async def test_a_python_data_session_draws_text_with_agg_and_no_font_warning(
    worker_image: ImageBuildResult, python_data: TemplateImage
) -> None:
    code = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import numpy, pandas, matplotlib, scipy.stats
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot(numpy.arange(5), pandas.Series([3, 1, 4, 1, 5]))
    ax.set_title("Größe über Zeit"); ax.set_xlabel("x"); ax.legend(["line"])
    fig.savefig("/tmp/figure.png")
    plt.close(fig)
import os
(matplotlib.get_backend().lower(), os.path.getsize("/tmp/figure.png") > 5000,
 [str(w.message) for w in caught], round(float(scipy.stats.norm.cdf(0)), 3))
"""
    async with Orchestrator(config(worker_image.tag)) as orch:
        result = await orch.execute(code, policy="python-data")
        image = await _image_of(orch, result.session_id)
    assert result.success, result.traceback
    assert result.result_repr == "('agg', True, [], 0.5)"
    assert result.stderr == ""
    assert image == python_data.tag


async def _image_of(orch: Orchestrator, session_id: str) -> str:
    """The image a session's container was made from, as the engine says."""
    session = orch.find_session(session_id)
    return str((await orch.backend.inspect(session.container_id))["Config"]["Image"])


async def test_the_template_build_has_no_network_and_a_user_pin_is_importable(
    docker_client: DockerClient,
    worker_image: ImageBuildResult,
    template_dir: Path,
    policy_dir: Path,
    made_images: list[str],
) -> None:
    (template_dir / "extra.toml").write_text(
        f'description = "six on top of base"\npip = ["{SIX}"]\npreload = ["six"]\n'
    )
    # A Dockerfile template records the network interfaces its build container has.
    (template_dir / "probe.Dockerfile").write_text(
        "ARG SANDHOLD_PARENT\nFROM ${SANDHOLD_PARENT}\nUSER 0:0\n"
        "RUN ls /sys/class/net > /opt/sandhold/build-net\nUSER 10001:10001\n"
    )
    (template_dir / "probe.toml").write_text('from = "extra"\ndockerfile = "probe.Dockerfile"\n')
    catalog = load_catalog([template_dir])
    with anyio.fail_after(BUILD_TIMEOUT):
        probe = await ensure_template_image(
            docker_client, catalog, "probe", base_tag=worker_image.tag, progress=NullProgress()
        )
    hashes = template_hashes(catalog, probe_base := await _identity(docker_client, worker_image))
    made_images.extend([template_tag("extra", hashes["extra"]), probe.tag])
    assert probe.tag == template_tag("probe", hashes["probe"]) and probe_base
    settings = config(worker_image.tag, template_dirs=(template_dir,), policy_dirs=(policy_dir,))
    (policy_dir / "uses-probe.toml").write_text(
        'extends = "unrestricted-python"\n[image]\ntemplate = "probe"\n'
    )
    async with Orchestrator(settings) as orch:
        result = await orch.execute(
            "import six\nprint(six.__version__, open('/opt/sandhold/build-net').read().split())",
            policy="uses-probe",
        )
    assert result.success, result.traceback
    # Only loopback: the build ran with the network off.
    assert result.stdout == "1.17.0 ['lo']\n"


async def _identity(client: DockerClient, worker_image: ImageBuildResult) -> str:
    from orchestrator.images.template_build import image_identity

    return await image_identity(client, worker_image.tag)


async def test_a_policy_naming_an_unknown_template_is_refused_when_it_loads(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    (tmp_path / "bad.toml").write_text('extends = "default"\n[image]\ntemplate = "nope"\n')
    async with Orchestrator(config(worker_image.tag, policy_dirs=(tmp_path,))) as orch:
        with pytest.raises(UnknownTemplateError) as caught:
            await orch.create_session(policy="bad")
        answer = await orch.call(
            "python_repl", {"operation": "execute", "code": "1", "policy": "bad"}
        )
    assert caught.value.key == "image.template"
    assert answer.structured["error_type"] == "unknown_template"
    assert "bad.toml" in answer.structured["error_message"]
    env = {**os.environ, "SANDHOLD_IMAGE": worker_image.tag}
    with anyio.fail_after(CLI_TIMEOUT):
        done = await anyio.run_process(
            [sys.executable, "-m", "orchestrator.cli", "image", "build", "--template", "nope"],
            env=env, check=False,
        )  # fmt: skip
    assert done.returncode == 2
    assert "unknown_template" in done.stderr.decode()


async def test_image_list_shows_the_shipped_templates_and_the_two_built_here(
    worker_image: ImageBuildResult, python_data: TemplateImage
) -> None:
    env = {**os.environ, "SANDHOLD_IMAGE": worker_image.tag, "COLUMNS": "250"}
    with anyio.fail_after(CLI_TIMEOUT):
        done = await anyio.run_process(
            [sys.executable, "-m", "orchestrator.cli", "image", "list"], env=env, check=False
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    rows = {
        line.split("│")[1].strip(): line for line in out.splitlines() if "sandhold-worker:" in line
    }
    assert set(rows) == {BASE, "code-interpreter", "code-interpreter-full", "pip", "python-data"}
    assert worker_image.tag in rows[BASE] and python_data.tag in rows["python-data"]
    assert all(" built " in rows[name] and " MB " in rows[name] for name in (BASE, "python-data"))
    assert " shipped " in rows["pip"] and "sandhold-worker:pip-" in rows["pip"]


async def test_prune_keeps_a_superseded_template_image_a_session_uses_then_lets_it_go(
    docker_client: DockerClient,
    worker_image: ImageBuildResult,
    python_data: TemplateImage,
    template_dir: Path,
    policy_dir: Path,
    made_images: list[str],
) -> None:
    path = template_dir / "mine.toml"
    path.write_text(f'pip = ["{SIX}"]\n')
    (policy_dir / "uses-mine.toml").write_text('extends = "default"\n[image]\ntemplate = "mine"\n')
    settings = config(worker_image.tag, template_dirs=(template_dir,), policy_dirs=(policy_dir,))
    async with Orchestrator(settings) as orch:
        session = await orch.create_session(policy="uses-mine")
        old = await _image_of(orch, session.id)
        made_images.append(old)
        # The file changes: the running session's image is superseded.
        path.write_text(f'pip = ["{SIX}"]\n[env]\nMINE = "2"\n')
        keep = await _current_tags(docker_client, worker_image, template_dir)
        assert old not in keep and python_data.tag in keep
        while_used = await prune_worker_images(
            docker_client, current=worker_image.tag, keep=keep, dry_run=True
        )
    assert old in dict(while_used.kept) and "use it" in dict(while_used.kept)[old]
    assert python_data.tag not in while_used.removed
    after = await prune_worker_images(
        docker_client, current=worker_image.tag, keep=keep, dry_run=True
    )
    assert old in after.removed  # nothing uses it now: superseded, pruned by a real run
    assert python_data.tag not in after.removed and worker_image.tag not in after.removed


async def _current_tags(
    client: DockerClient, worker_image: ImageBuildResult, template_dir: Path
) -> list[str]:
    hashes = template_hashes(load_catalog([template_dir]), await _identity(client, worker_image))
    return [template_tag(name, digest) for name, digest in hashes.items() if name != BASE]


async def test_a_pooled_python_data_session_has_its_modules_imported_before_the_first_cell(
    worker_image: ImageBuildResult, python_data: TemplateImage
) -> None:
    probe = "import sys\n[m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules]"
    async with Orchestrator(config(worker_image.tag, pool={"python-data": 1})) as orch:
        cold = await orch.execute(probe, policy="unrestricted-python")
        with anyio.fail_after(BUILD_TIMEOUT):
            while orch.pool_status()["python-data"]["ready"] < 1:  # noqa: ASYNC110 (no event)
                await anyio.sleep(0.1)
        pooled = await orch.execute(probe, policy="python-data")
    assert cold.result_repr == "[]"
    assert pooled.result_repr == "['numpy', 'pandas', 'matplotlib.pyplot']"


async def test_a_restricted_session_from_a_preloaded_pool_is_still_refused_by_name(
    worker_image: ImageBuildResult, python_data: TemplateImage, tmp_path: Path
) -> None:
    (tmp_path / "restricted-data.toml").write_text(
        'extends = "default"\n[image]\ntemplate = "python-data"\n'
    )
    settings = config(worker_image.tag, policy_dirs=(tmp_path,), pool={"restricted-data": 1})
    async with Orchestrator(settings) as orch:
        with anyio.fail_after(BUILD_TIMEOUT):
            while orch.pool_status()["restricted-data"]["ready"] < 1:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        first = await orch.execute("import pandas", policy="restricted-data")
        session = orch.find_session(first.session_id)
        # The worker process has os loaded (every Python does): refused by name all the same.
        again = await orch.execute("import os", session_id=first.session_id)
        allowed = await orch.execute(
            "import statistics\nstatistics.mean([1, 3])", session_id=first.session_id
        )
        assert session.policy.python.mode == "restricted"
    assert first.error_type == "import_blocked" and not first.success
    assert again.error_type == "import_blocked"
    assert allowed.result_repr == "2"
