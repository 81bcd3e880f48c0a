"""E2B's template build steps as sandhold layers (``orchestrator.http.e2b._templates``): each
step's Dockerfile lines, ``apt_install`` as a layer of Debian packages, and every step or upload
sandhold will not build refused with a stable ``error_type`` (pure: nothing is built here)."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import pytest

from orchestrator.http.e2b._templates import (
    MAX_STEPS,
    MAX_UNPACKED_BYTES,
    BuildRefused,
    _check_tar,
    plan_layers,
)

DIGEST = "a" * 64
APT = (
    "apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install "
    "-y --no-install-recommends jq curl"
)


def run(command: str, user: str | None = None) -> dict[str, Any]:
    return {"type": "RUN", "args": [command, user] if user else [command]}


def test_steps_become_dockerfile_lines_in_order() -> None:
    (layer,) = plan_layers([
        {"type": "ENV", "args": ["A", "one two", "B", 'q"uote']},
        run("echo hi"),
        run("whoami", "sandbox"),
        {"type": "WORKDIR", "args": ["/app"]},
        {"type": "USER", "args": ["sandbox"]},
        run("id"),
    ])  # fmt: skip
    assert layer.lines == (
        "USER 0:0",
        'ENV A="one two"',
        'ENV B="q\\"uote"',
        'RUN ["/bin/sh", "-c", "echo hi"]',
        "USER sandbox",
        'RUN ["/bin/sh", "-c", "whoami"]',
        "USER 0:0",
        'WORKDIR "/app"',
        "USER sandbox",
        'RUN ["/bin/sh", "-c", "id"]',
    )


def test_a_copy_adds_its_upload_and_copies_as_root_then_back_to_the_user() -> None:
    (layer,) = plan_layers([
        {"type": "USER", "args": ["sandbox"]},
        {"type": "COPY", "args": ["data/*", "dest", "sandbox", "0755"], "filesHash": DIGEST},
    ])  # fmt: skip
    assert layer.files == (DIGEST,)
    add, copy = layer.lines[3], layer.lines[4]
    assert add == f'ADD ["files/{DIGEST}.tar", "/opt/sandhold-e2b-copy/{DIGEST}/"]'
    argv = json.loads(copy.removeprefix("RUN "))
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[3:] == ["copy", f"/opt/sandhold-e2b-copy/{DIGEST}", "data/*", "dest", "sandbox",
                        "0755"]  # fmt: skip
    assert layer.lines[2] == "USER 0:0" and layer.lines[-1] == "USER sandbox"


def test_apt_install_is_a_layer_of_its_own_between_the_others() -> None:
    layers = plan_layers([run("echo before"), run(APT, "root"), run("jq --version")])
    assert [layer.debs for layer in layers] == [(), ("jq", "curl"), ()]
    assert layers[2].lines[0] == "USER 0:0"


@pytest.mark.parametrize(
    ("steps", "error_type", "message"),
    [
        ([run("pip install requests", "root")], "template_step", "installs from an index"),
        ([run("true")] * (MAX_STEPS + 1), "template_steps", "at most"),
        ([run("true", "root 1")], "template_step", "not a user name"),
        ([{"type": "ENV", "args": ["A"]}], "template_step", "pairs"),
        ([{"type": "ENV", "args": ["A-B", "1"]}], "template_step", "no name"),
        ([{"type": "ENV", "args": ["A", "two\nlines"]}], "template_step", "line break"),
        ([{"type": "WORKDIR", "args": ["/a\nRUN x"]}], "template_step", "line break"),
        ([{"type": "COPY", "args": ["a", "b"]}], "template_step", "without its files"),
        ([{"type": "COPY", "args": ["../etc", "b"], "filesHash": DIGEST}], "template_step",
         "leaves"),
        ([{"type": "COPY", "args": ["a", "b", "", "rwx"], "filesHash": DIGEST}], "template_step",
         "no mode"),
        ([{"type": "ADD", "args": ["a"]}], "template_step", "not a step"),
        ("RUN x", "template_step", "must be a list"),
    ],
)  # fmt: skip
def test_what_sandhold_will_not_build_is_refused(steps: Any, error_type: str, message: str) -> None:
    with pytest.raises(BuildRefused, match=message) as refused:
        plan_layers(steps)
    assert refused.value.error_type == error_type


def _tar(*members: tarfile.TarInfo) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 1) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size if kind == tarfile.REGTYPE else 0
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/hostname"
    return info


def test_an_upload_of_files_folders_and_links_is_accepted() -> None:
    _check_tar(
        _tar(_member("dir", tarfile.DIRTYPE), _member("dir/a"), _member("dir/l", tarfile.SYMTYPE))
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not a tar", "not a tar archive"),
        (_tar(_member("/etc/passwd")), "leaves the upload"),
        (_tar(_member("a/../../b")), "leaves the upload"),
        (_tar(_member("dev", tarfile.CHRTYPE)), "not a file, folder or link"),
        (_tar(_member("fifo", tarfile.FIFOTYPE)), "not a file, folder or link"),
    ],
)
def test_an_upload_that_is_not_plain_files_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(BuildRefused, match=message) as refused:
        _check_tar(data)
    assert refused.value.error_type == "template_files"


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, made as they are read: a bomb's payload never sits in memory."""

    def __init__(self, size: int) -> None:
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self._left)
        buffer[:count] = bytes(count)
        self._left -= count
        return count


def _bomb(compression: str) -> bytes:
    """A small archive of one file of zeros past ``MAX_UNPACKED_BYTES``."""
    out = io.BytesIO()
    # The fastest level of each: the bomb is made in the test, and zeros shrink at any level.
    level = {"preset": 0} if compression == "xz" else {"compresslevel": 1}
    with tarfile.open(fileobj=out, mode=f"w:{compression}", **level) as archive:
        member = tarfile.TarInfo("zeros")
        member.size = MAX_UNPACKED_BYTES + 1024 * 1024
        archive.addfile(member, _Zeros(member.size))
    return out.getvalue()


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_a_compression_bomb_is_refused_before_it_is_unpacked(compression: str) -> None:
    bomb = _bomb(compression)
    assert len(bomb) < MAX_UNPACKED_BYTES // 100  # small on the wire
    with pytest.raises(BuildRefused, match="unpacks to more than") as refused:
        _check_tar(bomb)
    assert refused.value.error_type == "template_files"


def test_a_sparse_file_is_refused() -> None:
    """A sparse member claims any size its holes make; the image would hold the file whole."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        member = _member("holes")
        member.type = tarfile.GNUTYPE_SPARSE
        archive.addfile(member, io.BytesIO(b"x"))
    with pytest.raises(BuildRefused, match="not a file, folder or link"):
        _check_tar(out.getvalue())
