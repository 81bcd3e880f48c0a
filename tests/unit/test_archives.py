"""A download is judged on the host by the rules of an upload before it goes out: whatever the
file helper (or something posing as it) sent, the client gets only checked members, rewritten."""

from __future__ import annotations

import io
import tarfile

import pytest

from orchestrator.errors import BackendError
from orchestrator.session.files.archives import checked_download


def tar_of(*members: tuple[str, bytes, str]) -> bytes:
    """A tar of ``(name, type, data or link target)`` members, written as a forger would."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            data = None
            if kind == tarfile.REGTYPE:
                data = io.BytesIO(payload.encode())
                info.size = len(payload)
            else:
                info.linkname = payload
            tar.addfile(info, data)
    return buffer.getvalue()


FILE, DIR, SYM, LNK = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


@pytest.mark.parametrize(
    "members",
    [
        [("../../../../tmp/x", FILE, "x")],
        [("/tmp/y", FILE, "y")],
        [("proj", DIR, ""), ("proj/../../etc/z", FILE, "z")],
        [("proj", DIR, ""), ("proj/out", SYM, "/etc")],
        [("proj", DIR, ""), ("proj/out", SYM, "../../../etc/passwd")],
        [("proj", DIR, ""), ("proj/empty", SYM, "")],
        [("proj", DIR, ""), ("proj/a", FILE, "a"), ("proj/b", LNK, "proj/a")],
        [("proj", DIR, ""), ("proj/dev", tarfile.CHRTYPE, "")],
        [("proj", DIR, ""), ("proj/fifo", tarfile.FIFOTYPE, "")],
        [("proj/link", SYM, "/workspace"), ("proj/link/x", FILE, "x")],
        [(".", DIR, "")],
    ],
    ids=[
        "climbing",
        "absolute",
        "climbing-inside",
        "symlink-absolute-out",
        "symlink-climbing-out",
        "symlink-empty",
        "hard-link",
        "device",
        "fifo",
        "below-a-symlink",
        "the-directory-itself",
    ],
)
def test_a_forged_download_is_refused_on_the_host(members: list[tuple[str, bytes, str]]) -> None:
    with pytest.raises(BackendError) as caught:
        checked_download(tar_of(*members), "/workspace")
    assert caught.value.code == "internal"


def test_bytes_that_are_not_a_tar_are_refused() -> None:
    with pytest.raises(BackendError):
        checked_download(b"\x00garbage" * 100, "/workspace")


def test_a_checked_download_keeps_files_directories_and_links_inside() -> None:
    archive = tar_of(
        ("proj", DIR, ""),
        ("proj/a.txt", FILE, "alpha"),
        ("proj/rel", SYM, "a.txt"),
        ("proj/abs", SYM, "/workspace/proj/a.txt"),
    )
    data, entries = checked_download(archive, "/workspace")
    assert entries == 4
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {info.name: info for info in tar}
        assert [members["proj/rel"].linkname, members["proj/abs"].linkname] == [
            "a.txt",
            "/workspace/proj/a.txt",
        ]
        extracted = tar.extractfile("proj/a.txt")
        assert extracted is not None and extracted.read() == b"alpha"


def test_a_download_is_rewritten_from_what_was_checked() -> None:
    """Owners, set-id bits and pax records of the helper's tar do not travel on."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("f")
        info.mode, info.uid, info.uname, info.size = 0o4755, 0, "root", 1
        info.pax_headers = {"comment": "forged", "SCHILY.xattr.user.x": "y"}
        tar.addfile(info, io.BytesIO(b"x"))
    data, _ = checked_download(buffer.getvalue(), "/workspace")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (member,) = tar.getmembers()
    assert (member.mode, member.uname, member.pax_headers) == (0o755, "", {})


def test_a_member_judged_from_a_deeper_parent_may_climb_to_the_workspace() -> None:
    archive = tar_of(("sub", DIR, ""), ("sub/up", SYM, "../../top.txt"))
    assert checked_download(archive, "/workspace/deep")[1] == 2
    with pytest.raises(BackendError):
        checked_download(archive, "/workspace")
