"""Templates without an engine: lock files, template files, the catalogue, and the inputs hash
that names each template's image."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import TemplateFileError, UnknownTemplateError
from orchestrator.images.lockfile import LockError, Pin, lock_digest, parse_lock, render_lock
from orchestrator.images.template_build import (
    dockerfile_of,
    inputs_hash,
    template_hashes,
    template_tag,
)
from orchestrator.images.template_wheels import TemplateTarget, parse_target
from orchestrator.images.templates import BASE, load_catalog, load_template_file

SIX = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"
OTHER = "ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_lock_reads_pins_with_every_hash_across_continued_lines() -> None:
    text = f"""# a comment
Six==1.17.0 \\
    --hash=sha256:{SIX} \\
    --hash=sha256:{OTHER}  # trailing
python_dateutil==2.9.0 --hash=sha256:{SIX}
"""
    pins = parse_lock(text)
    assert pins == (
        Pin("python-dateutil", "2.9.0", (SIX,)),
        Pin("six", "1.17.0", tuple(sorted((SIX, OTHER)))),
    )
    assert parse_lock(render_lock(pins, header="made by a test")) == pins


@pytest.mark.parametrize(
    "line",
    [
        "six",  # not pinned
        "six>=1.0 --hash=sha256:" + SIX,  # a range
        "six[extra]==1.0 --hash=sha256:" + SIX,  # extras
        "six==1.17.0",  # no hash
        "six==1.17.0 --hash=md5:abc",  # another algorithm
        "six==1.17.0 --hash=sha256:" + SIX[:-1],  # short digest
        "six==1.17.0 --index-url https://example.invalid --hash=sha256:" + SIX,  # an option
        "https://example.invalid/six.whl --hash=sha256:" + SIX,  # a URL
        f"six==1.17.0 --hash=sha256:{SIX}\nsix==1.16.0 --hash=sha256:{OTHER}",  # twice
        "six==1.17.0 \\",  # a continuation at the end
    ],
)
def test_a_lock_line_that_does_not_pin_exact_files_is_refused(line: str) -> None:
    with pytest.raises(LockError, match=r"line [12]"):
        parse_lock(line)


def test_the_lock_digest_covers_pins_not_comments_or_layout() -> None:
    one = parse_lock(f"six==1.17.0 --hash=sha256:{SIX} --hash=sha256:{OTHER}")
    two = parse_lock(f"# note\nsix==1.17.0 \\\n  --hash=sha256:{OTHER} \\\n  --hash=sha256:{SIX}\n")
    three = parse_lock(f"six==1.17.0 --hash=sha256:{SIX}")
    assert lock_digest(one) == lock_digest(two) != lock_digest(three)


def test_the_shipped_python_data_lock_pins_every_package_with_hashes() -> None:
    catalog = load_catalog()
    assert catalog.names() == [
        BASE,
        "code-interpreter",
        "code-interpreter-full",
        "pip",
        "python-data",
    ]
    data = catalog.get("python-data")
    names = {pin.name for pin in data.pins}
    assert {"numpy", "pandas", "matplotlib", "scipy", "pillow"} <= names
    # Transitive dependencies are pinned too (pandas needs dateutil, matplotlib pyparsing).
    assert {"python-dateutil", "pyparsing", "contourpy", "kiwisolver"} <= names
    assert all(pin.hashes for pin in data.pins)
    assert data.env == {"MPLBACKEND": "Agg"}
    assert "pandas" in data.preload and data.parent == BASE


def test_the_shipped_pip_template_installs_the_pip_the_build_installs_with() -> None:
    from orchestrator.images.template_build import _with_pip, pip_pins

    template = load_catalog().get("pip")
    assert template.pins == pip_pins() and template.parent == BASE
    assert _with_pip(template) == pip_pins()  # one wheel: installer and installed
    assert template.env["PIP_BREAK_SYSTEM_PACKAGES"] == "1"


def test_a_template_pinning_another_pip_than_the_builds_is_refused(tmp_path: Path) -> None:
    from orchestrator.images.template_build import _with_pip

    write(tmp_path / "mypip.toml", f'pip = ["pip==1.0 --hash=sha256:{SIX}"]\n')
    template = load_catalog([tmp_path]).get("mypip")
    with pytest.raises(TemplateFileError, match="pip is the build's own"):
        _with_pip(template)


def test_a_user_template_with_inline_pins_joins_the_catalogue(tmp_path: Path) -> None:
    write(
        tmp_path / "extra.toml",
        f'from = "python-data"\npip = ["six==1.17.0 --hash=sha256:{SIX}"]\npreload = ["six"]\n',
    )
    catalog = load_catalog([tmp_path, tmp_path / "missing"])
    assert catalog.names() == [
        BASE,
        "code-interpreter",
        "code-interpreter-full",
        "extra",
        "pip",
        "python-data",
    ]
    assert [t.name for t in catalog.chain("extra")] == ["extra", "python-data", BASE]
    assert not catalog.get("extra").shipped


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("x", 'pip = ["six"]', "pip"),  # an unpinned requirement
        ("x", "", "-"),  # neither pins nor a Dockerfile
        ("x", f'pip = ["six==1 --hash=sha256:{SIX}"]\ndockerfile = "D"', "-"),  # both
        ("x", f'pip = ["six==1 --hash=sha256:{SIX}"]\ncolour = 1', "colour"),  # unknown key
        ("x", f'pip = ["six==1 --hash=sha256:{SIX}"]\n[env]\nPATH = "/x"', "env"),  # reserved
        ("x", f'pip = ["six==1 --hash=sha256:{SIX}"]\n[env]\nA = "a b"', "env.A"),  # quoting
        ("x", 'lock = "../outside.lock"', "lock"),  # outside the folder
        ("x", f'from = "x"\npip = ["six==1 --hash=sha256:{SIX}"]', "from"),  # itself
        ("Bad_Name", f'pip = ["six==1 --hash=sha256:{SIX}"]', "name"),
    ],
)
def test_a_bad_template_file_is_refused_naming_file_and_key(
    tmp_path: Path, name: str, text: str, key: str
) -> None:
    path = write(tmp_path / f"{name}.toml", text)
    with pytest.raises(TemplateFileError) as caught:
        load_template_file(path, shipped=False)
    assert caught.value.key == key
    assert caught.value.code == "invalid_argument"


def test_a_user_template_may_not_take_a_shipped_name_or_an_unknown_parent(tmp_path: Path) -> None:
    write(tmp_path / "python-data.toml", f'pip = ["six==1 --hash=sha256:{SIX}"]')
    with pytest.raises(TemplateFileError, match="already shipped"):
        load_catalog([tmp_path])
    (tmp_path / "python-data.toml").unlink()
    write(tmp_path / "orphan.toml", f'from = "nowhere"\npip = ["six==1 --hash=sha256:{SIX}"]')
    with pytest.raises(TemplateFileError) as caught:
        load_catalog([tmp_path])
    assert caught.value.key == "from"


def test_an_unknown_template_is_its_own_error_type() -> None:
    with pytest.raises(UnknownTemplateError) as caught:
        load_catalog().get("nope")
    assert caught.value.code == "unknown_template"


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("ARG SANDHOLD_PARENT\nFROM ${SANDHOLD_PARENT}\nRUN true\n", True),
        ("# comment\nARG SANDHOLD_PARENT\nFROM $SANDHOLD_PARENT\n", True),
        ("FROM debian:bookworm\n", False),
        ("ARG SANDHOLD_PARENT\nFROM ${SANDHOLD_PARENT}\nFROM debian\n", False),
        ("RUN true\nFROM ${SANDHOLD_PARENT}\n", False),
    ],
)
def test_a_user_dockerfile_starts_from_one_of_ours_only(
    tmp_path: Path, text: str, ok: bool
) -> None:
    write(tmp_path / "Dockerfile", text)
    path = write(tmp_path / "mine.toml", 'dockerfile = "Dockerfile"\n')
    if ok:
        assert load_template_file(path, shipped=False).dockerfile == text.encode()
    else:
        with pytest.raises(TemplateFileError):
            load_template_file(path, shipped=False)


def test_the_inputs_hash_moves_with_the_parent_the_pins_and_the_env_and_not_preload(
    tmp_path: Path,
) -> None:
    def template(extra: str) -> object:
        path = write(tmp_path / "t.toml", f'pip = ["six==1 --hash=sha256:{SIX}"]\n{extra}')
        return load_template_file(path, shipped=False)

    def digest(t: object, parent: str = "p" * 64) -> str:
        return inputs_hash(t, parent, dockerfile=dockerfile_of(t), files=[])  # type: ignore[arg-type]

    plain = template("")
    assert digest(plain) == digest(template('description = "other words"'))
    assert digest(plain) == digest(template('preload = ["six"]'))
    assert digest(plain) != digest(template('[env]\nA = "1"'))
    assert digest(plain) != digest(plain, parent="q" * 64)
    other_pin = write(tmp_path / "t.toml", f'pip = ["six==1 --hash=sha256:{OTHER}"]')
    assert digest(plain) != digest(load_template_file(other_pin, shipped=False))
    assert template_tag("t", digest(plain)) == f"sandhold-worker:t-{digest(plain)[:16]}"


def test_every_template_hash_chains_from_the_worker_image_hash(tmp_path: Path) -> None:
    write(tmp_path / "extra.toml", f'from = "python-data"\npip = ["six==1 --hash=sha256:{SIX}"]')
    catalog = load_catalog([tmp_path])
    one, two = template_hashes(catalog, "a" * 64), template_hashes(catalog, "b" * 64)
    assert one[BASE] == "a" * 64
    assert set(one) == {
        BASE,
        "code-interpreter",
        "code-interpreter-full",
        "pip",
        "python-data",
        "extra",
    }
    assert all(one[name] != two[name] for name in one)
    assert template_hashes(catalog, "a" * 64) == one


def test_the_parent_probe_gives_every_manylinux_level_its_glibc_loads() -> None:
    target = parse_target("3.11 x86_64 glibc 2.36\n")
    assert target == TemplateTarget("3.11", "x86_64", "glibc", 2, 36)
    platforms = target.platforms()
    assert platforms[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in platforms and "manylinux2014_x86_64" in platforms
    with pytest.raises(Exception, match="glibc"):
        parse_target("3.12 x86_64 unknown 0.0").platforms()
    with pytest.raises(Exception, match="unexpected"):
        parse_target("3.12; rm -rf /")


def test_the_code_interpreter_template_is_debian_packages_on_python_data() -> None:
    template = load_catalog().get("code-interpreter")
    assert template.parent == "python-data" and template.debs == ("nodejs", "node-typescript")
    assert template.pins == () and template.dockerfile is None
    dockerfile = dockerfile_of(template)
    assert b"dpkg -i" in dockerfile and b"pip" not in dockerfile
    full = load_catalog().get("code-interpreter-full")
    assert full.parent == "code-interpreter"
    assert full.debs == ("r-base-core", "openjdk-17-jdk-headless")


def test_a_template_with_debs_and_another_way_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "both.toml"
    path.write_text('debs = ["nodejs"]\npip = ["six==1.16.0 --hash=sha256:' + "0" * 64 + '"]\n')
    with pytest.raises(TemplateFileError, match="exactly one of lock, pip, dockerfile and debs"):
        load_template_file(path, shipped=False)
    bad = tmp_path / "bad.toml"
    bad.write_text('debs = ["No Such; rm"]\n')
    with pytest.raises(TemplateFileError, match="debs"):
        load_template_file(bad, shipped=False)
