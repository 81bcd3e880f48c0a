"""The files tool against real session containers: round trips, archives, and every refusal
leaving the sandbox exactly as it was."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import orchestrator.session.files.operations as files_module
from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import BackendError, InvalidArgumentError, QuotaExceededError
from orchestrator.policy.model import Policy, load_policy
from orchestrator.session.files.operations import SessionFiles
from tests.conftest import ContainerFactory

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

SMALL_LIMIT = 1000
# Every entry under the writable mounts, so a refusal can be shown to have changed nothing.
SNAPSHOT = """
import json, os
seen = {}
for top in ("/workspace", "/tmp", "/home/sandbox"):
    for folder, dirs, names in os.walk(top):
        for name in dirs + names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            seen[path] = [st.st_mode, st.st_size, st.st_mtime_ns]
print(json.dumps(seen))
"""

Shell = Callable[..., Awaitable[str]]
Snapshot = Callable[[], Awaitable[dict[str, Any]]]


def small_policy() -> Policy:
    policy = load_policy("default")
    limits = policy.limits.model_copy(update={"max_file_bytes": SMALL_LIMIT})
    return policy.model_copy(update={"limits": limits})


@pytest.fixture
async def container(make_container: ContainerFactory) -> str:
    return await make_container(load_policy("default"))


@pytest.fixture
def files(docker_backend: DockerBackend, container: str) -> SessionFiles:
    return SessionFiles(docker_backend, container, load_policy("default"))


@pytest.fixture
def small_files(docker_backend: DockerBackend, container: str) -> SessionFiles:
    return SessionFiles(docker_backend, container, small_policy())


@pytest.fixture
def sh(docker_backend: DockerBackend, container: str) -> Shell:
    """Run a shell command in the container as the sandbox user; its stdout, or a failure."""

    async def run(command: str) -> str:
        argv = ["sh", "-c", command]
        result = await docker_backend.run(
            container, ExecSpec(argv=argv), timeout=30, max_output_bytes=1 << 20
        )
        assert result.exit_code == 0, result.stderr.decode()
        return result.stdout.decode()

    return run


@pytest.fixture
def snapshot(docker_backend: DockerBackend, container: str) -> Snapshot:
    async def take() -> dict[str, Any]:
        argv = ["python3", "-I", "-c", SNAPSHOT]
        result = await docker_backend.run(
            container, ExecSpec(argv=argv), timeout=30, max_output_bytes=1 << 20
        )
        assert result.exit_code == 0, result.stderr.decode()
        seen: dict[str, Any] = json.loads(result.stdout)
        return seen

    return take


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def special_member(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


# Round trips


async def test_text_written_is_read_back_as_text(files: SessionFiles) -> None:
    written = await files.write("notes.txt", content="héllo\nwörld\n")
    read = await files.read("notes.txt")

    assert written.path == "/workspace/notes.txt"
    assert written.size == len("héllo\nwörld\n".encode())
    assert written.created
    assert read.encoding == "utf-8"
    assert read.content == "héllo\nwörld\n"
    assert read.content_b64 is None


async def test_every_byte_value_survives_a_binary_round_trip(files: SessionFiles) -> None:
    data = bytes(range(256)) * 4
    await files.write("blob.bin", content_b64=base64.b64encode(data).decode())
    read = await files.read("blob.bin")

    assert read.encoding == "base64"
    assert read.content is None
    assert read.content_b64 is not None
    assert base64.b64decode(read.content_b64) == data
    assert read.size == len(data)


async def test_wrapped_base64_as_the_base64_tool_prints_it_is_accepted(files: SessionFiles) -> None:
    data = bytes(range(256))
    wrapped = base64.encodebytes(data).decode()  # lines of 76 characters
    await files.write("wrapped.bin", content_b64=wrapped)
    read = await files.read("wrapped.bin")
    assert read.content_b64 is not None
    assert base64.b64decode(read.content_b64) == data


async def test_writing_creates_missing_parent_directories(files: SessionFiles) -> None:
    await files.write("a/b/c/deep.txt", content="deep")

    assert (await files.read("a/b/c/deep.txt")).content == "deep"
    listing = await files.list("a/b")
    assert [(entry.name, entry.type) for entry in listing.entries] == [("c", "dir")]


async def test_writing_into_a_missing_directory_without_make_parents_is_refused(
    files: SessionFiles, snapshot: Snapshot
) -> None:
    before = await snapshot()
    with pytest.raises(InvalidArgumentError):
        await files.write("missing/x.txt", content="x", make_parents=False)
    assert await snapshot() == before


async def test_a_rewritten_file_is_replaced_and_keeps_its_mode(
    files: SessionFiles, sh: Shell
) -> None:
    await files.write("run.sh", content="echo one\n")
    await sh("chmod 755 /workspace/run.sh")
    second = await files.write("run.sh", content="echo two\n")

    assert not second.created
    assert (await files.read("run.sh")).content == "echo two\n"
    assert (await files.stat("run.sh")).mode == "0755"
    assert await sh("ls -A /workspace") == "run.sh\n"  # no temporary file left behind


async def test_listing_shows_names_types_sizes_and_modes(files: SessionFiles, sh: Shell) -> None:
    await files.write("b.txt", content="12345")
    await files.write("a/inner.txt", content="")
    await sh("ln -s b.txt /workspace/c-link && mkfifo /workspace/d-fifo")

    listing = await files.list(".")

    assert listing.path == "/workspace"
    assert not listing.truncated
    seen = {entry.name: entry for entry in listing.entries}
    assert [entry.name for entry in listing.entries] == ["a", "b.txt", "c-link", "d-fifo"]
    assert (seen["a"].type, seen["b.txt"].type) == ("dir", "file")
    assert (seen["c-link"].type, seen["c-link"].link_target) == ("symlink", "b.txt")
    assert seen["d-fifo"].type == "other"
    assert seen["b.txt"].size == 5
    assert seen["b.txt"].mode == "0644"
    assert seen["b.txt"].mtime > 0


async def test_a_symlink_that_stays_inside_the_workspace_is_followed(
    files: SessionFiles, sh: Shell
) -> None:
    await files.write("real/data.txt", content="data")
    await sh("ln -s real /workspace/alias")

    assert (await files.read("alias/data.txt")).content == "data"
    checked = await files.check("alias")
    assert (checked.real_path, checked.exists, checked.type) == ("/workspace/real", True, "dir")


async def test_an_uploaded_archive_is_extracted_and_its_members_read_back(
    files: SessionFiles,
) -> None:
    archive = tar_of(
        special_member("pkg", tarfile.DIRTYPE),
        file_member("pkg/mod.py", b"x = 1\n"),
        file_member("./pkg/sub/data.bin", bytes(range(256))),
        special_member("pkg/link", tarfile.SYMTYPE, "mod.py"),
    )
    uploaded = await files.upload("project", tar_b64=base64.b64encode(archive).decode())

    assert (uploaded.path, uploaded.entries, uploaded.size) == ("/workspace/project", 4, 262)
    assert (await files.read("project/pkg/mod.py")).content == "x = 1\n"
    assert (await files.read("project/pkg/link")).content == "x = 1\n"
    read = await files.read("project/pkg/sub/data.bin")
    assert read.content_b64 is not None
    assert base64.b64decode(read.content_b64) == bytes(range(256))


async def test_a_compressed_archive_given_as_bytes_is_extracted(files: SessionFiles) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info, data = file_member("hello.txt", b"hello")
        tar.addfile(info, io.BytesIO(data or b""))
    await files.upload(".", tar_bytes=buffer.getvalue())
    assert (await files.read("hello.txt")).content == "hello"


async def test_a_downloaded_directory_holds_its_members(files: SessionFiles, sh: Shell) -> None:
    await files.write("proj/a.txt", content="alpha")
    await files.write("proj/sub/b.bin", content_b64=base64.b64encode(b"\0\1\2").decode())
    await sh("ln -s a.txt /workspace/proj/link")

    downloaded = await files.download("proj")

    with tarfile.open(fileobj=io.BytesIO(downloaded.tar_bytes())) as tar:
        members = {member.name: member for member in tar.getmembers()}
        assert sorted(members) == ["proj", "proj/a.txt", "proj/link", "proj/sub", "proj/sub/b.bin"]
        assert members["proj/link"].issym()
        assert members["proj/link"].linkname == "a.txt"
        extracted = tar.extractfile("proj/a.txt")
        assert extracted is not None
        assert extracted.read() == b"alpha"
    assert downloaded.entries == 5
    assert downloaded.size == len(downloaded.tar_bytes())


async def test_a_download_leaves_out_symlinks_that_lead_out_of_the_workspace(
    files: SessionFiles, sh: Shell
) -> None:
    """The host refuses an archive holding one (a forged reply would), so the helper omits them."""
    await files.write("proj/a.txt", content="alpha")
    await sh("cd /workspace/proj && ln -s /etc etc && ln -s ../../tmp up && ln -s a.txt in")
    downloaded = await files.download("proj")
    with tarfile.open(fileobj=io.BytesIO(downloaded.tar_bytes())) as tar:
        assert sorted(tar.getnames()) == ["proj", "proj/a.txt", "proj/in"]
    assert downloaded.entries == 3


async def test_a_download_uploads_back_to_the_same_tree(files: SessionFiles) -> None:
    await files.write("src/pkg/m.py", content="print(1)\n")
    downloaded = await files.download("src")
    await files.upload("copy", tar_b64=downloaded.tar_b64)
    assert (await files.read("copy/src/pkg/m.py")).content == "print(1)\n"


# Removing, moving, making directories, looking up


async def test_a_removed_file_is_gone_and_says_what_it_was(files: SessionFiles) -> None:
    await files.write("d/a.txt", content="x")
    removed = await files.remove("d/a.txt")
    assert (removed.path, removed.type) == ("/workspace/d/a.txt", "file")
    assert not (await files.exists("d/a.txt")).exists
    assert (await files.exists("d")).type == "dir"


async def test_a_directory_with_entries_is_removed_only_when_recursive(
    files: SessionFiles, sh: Shell
) -> None:
    await files.write("tree/sub/a.txt", content="x")
    await sh(
        "ln -s /etc /workspace/tree/sub/etc && touch /tmp/keep && ln -s /tmp/keep /workspace/tree/k"
    )
    with pytest.raises(InvalidArgumentError):
        await files.remove("tree")
    assert (await files.read("tree/sub/a.txt")).content == "x"

    assert (await files.remove("tree", recursive=True)).type == "dir"
    assert not (await files.exists("tree")).exists
    # The links inside went as links: what they pointed at is still there.
    assert await sh("test -e /etc/passwd && test -e /tmp/keep && echo kept") == "kept\n"


async def test_an_empty_directory_is_removed_without_recursive(files: SessionFiles) -> None:
    assert (await files.make_dir("empty")).created
    assert (await files.remove("empty")).type == "dir"
    assert not (await files.exists("empty")).exists


async def test_removing_a_symlink_removes_the_link_not_its_target(
    files: SessionFiles, sh: Shell
) -> None:
    await files.write("target.txt", content="kept")
    await sh("ln -s target.txt /workspace/link && ln -s /etc/passwd /workspace/out")
    assert (await files.remove("link")).type == "symlink"
    assert (await files.remove("out")).type == "symlink"
    assert (await files.read("target.txt")).content == "kept"
    assert [e.name for e in (await files.list(".")).entries] == ["target.txt"]


async def test_removing_what_is_not_there_is_refused_as_reading_it_is(
    files: SessionFiles,
) -> None:
    with pytest.raises(InvalidArgumentError) as reading:
        await files.read("missing.txt")
    with pytest.raises(InvalidArgumentError) as removing:
        await files.remove("missing.txt")
    assert removing.value.code == reading.value.code == "path_not_found"
    assert "no such file" in str(removing.value) and "no such file" in str(reading.value)


async def test_the_workspace_itself_is_never_removed_nor_moved(
    files: SessionFiles, snapshot: Snapshot
) -> None:
    await files.write("a.txt", content="x")
    before = await snapshot()
    for operation in (
        files.remove(".", recursive=True),
        files.remove("/workspace/sub/..", recursive=True),
        files.rename(".", "elsewhere"),
        files.rename("a.txt", ".", overwrite=True),
    ):
        with pytest.raises(InvalidArgumentError):
            await operation
    assert await snapshot() == before


async def test_a_renamed_file_keeps_its_content_under_its_new_name(files: SessionFiles) -> None:
    await files.write("old.txt", content="moved")
    await files.make_dir("dir")
    moved = await files.rename("old.txt", "dir/new.txt")
    assert (moved.path, moved.new_path, moved.replaced) == (
        "/workspace/old.txt",
        "/workspace/dir/new.txt",
        False,
    )
    assert (await files.read("dir/new.txt")).content == "moved"
    assert not (await files.exists("old.txt")).exists


async def test_a_rename_onto_an_entry_is_refused_unless_overwrite(
    files: SessionFiles, snapshot: Snapshot
) -> None:
    await files.write("a.txt", content="a")
    await files.write("b.txt", content="b")
    before = await snapshot()
    with pytest.raises(InvalidArgumentError):
        await files.rename("a.txt", "b.txt")
    assert await snapshot() == before

    assert (await files.rename("a.txt", "b.txt", overwrite=True)).replaced
    assert (await files.read("b.txt")).content == "a"
    assert not (await files.exists("a.txt")).exists


async def test_a_rename_over_a_symlink_replaces_the_link_not_its_target(
    files: SessionFiles, sh: Shell
) -> None:
    await sh("touch /tmp/outside && ln -s /tmp/outside /workspace/link")
    await files.write("a.txt", content="a")
    assert (await files.rename("a.txt", "link", overwrite=True)).replaced
    assert (await files.stat("link")).type == "file"
    assert await sh("stat -c %s /tmp/outside") == "0\n"


async def test_a_directory_cannot_move_into_itself(files: SessionFiles, sh: Shell) -> None:
    await files.write("d/a.txt", content="x")
    with pytest.raises(InvalidArgumentError):
        await files.rename("d", "d/inner")
    # Through a link the host cannot see through: the kernel refuses, and so do we.
    await sh("ln -s d /workspace/alias")
    with pytest.raises(InvalidArgumentError):
        await files.rename("d", "alias/inner")
    assert (await files.read("d/a.txt")).content == "x"


async def test_a_rename_needs_its_source_and_the_new_directory(files: SessionFiles) -> None:
    await files.write("a.txt", content="a")
    with pytest.raises(InvalidArgumentError):
        await files.rename("missing.txt", "b.txt")
    with pytest.raises(InvalidArgumentError):
        await files.rename("a.txt", "no/such/dir/b.txt")
    assert (await files.read("a.txt")).content == "a"


async def test_make_dir_makes_parents_and_says_whether_it_created(files: SessionFiles) -> None:
    made = await files.make_dir("x/y/z")
    assert (made.path, made.created) == ("/workspace/x/y/z", True)
    assert not (await files.make_dir("x/y/z")).created
    assert not (await files.make_dir(".")).created
    assert (await files.stat("x/y")).type == "dir"


async def test_make_dir_without_parents_or_over_a_file_is_refused(
    files: SessionFiles, snapshot: Snapshot
) -> None:
    await files.write("f", content="x")
    before = await snapshot()
    for operation in (files.make_dir("p/q", parents=False), files.make_dir("f")):
        with pytest.raises(InvalidArgumentError):
            await operation
    assert await snapshot() == before


async def test_exists_tells_what_is_there_without_following_a_final_link(
    files: SessionFiles, sh: Shell
) -> None:
    await files.write("d/a.txt", content="x")
    await sh("ln -s /nowhere /workspace/dangling && ln -s /etc/passwd /workspace/out")
    found = {
        path: ((answer := await files.exists(path)).exists, answer.type)
        for path in (".", "d", "d/a.txt", "dangling", "out", "missing", "d/a.txt/below", "no/x")
    }
    assert found == {
        ".": (True, "dir"),
        "d": (True, "dir"),
        "d/a.txt": (True, "file"),
        "dangling": (True, "symlink"),
        "out": (True, "symlink"),
        "missing": (False, None),
        "d/a.txt/below": (False, None),
        "no/x": (False, None),
    }


async def test_stat_describes_one_entry_as_list_does(files: SessionFiles, sh: Shell) -> None:
    await files.write("d/a.txt", content="hello")
    await sh("chmod 640 /workspace/d/a.txt")
    entry = await files.stat("d/a.txt")
    listed = (await files.list("d")).entries[0]
    assert entry.model_dump(exclude={"path"}) == listed.model_dump()
    assert (entry.path, entry.size, entry.mode) == ("/workspace/d/a.txt", 5, "0640")
    with pytest.raises(InvalidArgumentError):
        await files.stat("d/missing")


async def test_the_small_new_operations_go_to_the_served_helper(files: SessionFiles) -> None:
    await files.make_dir("s")
    assert files._served.running
    await files.aclose()
    assert not files._served.running
    files = SessionFiles(files._backend, files._container_id, load_policy("default"))
    for operation in (files.exists("s"), files.rename("s", "t"), files.remove("t")):
        await operation
        assert files._served.running
    await files.aclose()


# Refusals: each one changes nothing


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../etc/passwd", "a/../../etc/passwd", "a\0b", "/tmp/x", ""]
)
async def test_a_path_outside_the_workspace_is_refused_for_every_operation(
    path: str, files: SessionFiles, snapshot: Snapshot
) -> None:
    await files.write("inside", content="x")
    before = await snapshot()
    operations = [
        files.write(path, content="x"),
        files.read(path),
        files.list(path),
        files.stat(path),
        files.check(path),
        files.download(path),
        files.upload(path, tar_bytes=tar_of(file_member("f", b"x"))),
        files.exists(path),
        files.remove(path, recursive=True),
        files.rename(path, "inside"),
        files.make_dir(path),
        files.rename("inside", path, overwrite=True),
    ]
    for operation in operations:
        with pytest.raises(InvalidArgumentError):
            await operation
    assert await snapshot() == before


@pytest.mark.parametrize("target", ["/etc", "/tmp"])
async def test_a_symlink_out_of_the_workspace_is_never_followed(
    target: str, files: SessionFiles, sh: Shell, snapshot: Snapshot
) -> None:
    await sh(f"ln -s {target} /workspace/out && touch /tmp/existing /workspace/mine")
    before = await snapshot()
    operations = [
        files.read("out/passwd"),
        files.read("out/existing"),
        files.write("out/x", content="x"),
        files.write("out/new/x", content="x", make_parents=True),
        files.list("out"),
        files.check("out"),
        files.download("out"),
        files.upload("out", tar_bytes=tar_of(file_member("f", b"x"))),
        files.upload(".", tar_bytes=tar_of(file_member("out/f", b"x"))),
        files.exists("out/passwd"),
        files.remove("out/existing"),
        files.remove("out/new", recursive=True),
        files.rename("out/existing", "moved"),
        files.rename("mine", "out/moved"),
        files.make_dir("out/new"),
        files.make_dir("out/new/deeper", parents=True),
    ]
    for operation in operations:
        with pytest.raises(InvalidArgumentError) as caught:
            await operation
        assert caught.value.code == "invalid_argument"
    assert await snapshot() == before


async def test_writing_to_a_symlink_is_refused_even_when_it_points_inside(
    files: SessionFiles, sh: Shell, snapshot: Snapshot
) -> None:
    await files.write("target.txt", content="original")
    await sh("ln -s target.txt /workspace/link")
    before = await snapshot()

    with pytest.raises(InvalidArgumentError):
        await files.write("link", content="changed")

    assert await snapshot() == before
    assert (await files.read("target.txt")).content == "original"


async def test_an_archive_member_over_an_existing_symlink_is_refused_whole(
    files: SessionFiles, sh: Shell, snapshot: Snapshot
) -> None:
    await files.write("target.txt", content="original")
    await sh("ln -s target.txt /workspace/link")
    archive = tar_of(file_member("fine.txt", b"fine"), file_member("link", b"changed"))
    before = await snapshot()

    with pytest.raises(InvalidArgumentError):
        await files.upload(".", tar_bytes=archive)

    assert await snapshot() == before


async def test_a_dangling_symlink_to_outside_is_neither_read_nor_written(
    files: SessionFiles, sh: Shell, snapshot: Snapshot
) -> None:
    await sh("ln -s /tmp/made-by-escape /workspace/dangling")
    before = await snapshot()

    for operation in [
        files.read("dangling"),
        files.write("dangling", content="x"),
        files.write("dangling/inner", content="x", make_parents=True),
        files.download("dangling"),
    ]:
        with pytest.raises(InvalidArgumentError):
            await operation

    assert await snapshot() == before
    assert "/tmp/made-by-escape" not in before


@pytest.mark.parametrize(
    "member",
    [
        file_member("../evil", b"x"),
        file_member("a/../../evil", b"x"),
        file_member("/tmp/evil", b"x"),
        special_member("etc-link", tarfile.SYMTYPE, "/etc"),
        special_member("up-link", tarfile.SYMTYPE, "../../tmp"),
        special_member("hard", tarfile.LNKTYPE, "/etc/passwd"),
        special_member("dev", tarfile.CHRTYPE),
        special_member("fifo", tarfile.FIFOTYPE),
    ],
    ids=[
        "dotdot",
        "nested-dotdot",
        "absolute",
        "symlink-etc",
        "symlink-up",
        "hardlink",
        "dev",
        "fifo",
    ],
)
async def test_an_archive_with_a_forbidden_member_is_refused_whole(
    member: tuple[tarfile.TarInfo, bytes | None], files: SessionFiles, snapshot: Snapshot
) -> None:
    archive = tar_of(file_member("fine.txt", b"fine"), member)
    before = await snapshot()
    with pytest.raises(InvalidArgumentError):
        await files.upload("dest", tar_bytes=archive)
    assert await snapshot() == before


async def test_an_archive_writing_below_its_own_symlink_is_refused(
    files: SessionFiles, snapshot: Snapshot
) -> None:
    # Judged lexically from /workspace/x each link stays inside; but "a" is /workspace, so
    # "a/b" really lives there and leads to /, and "a/b/tmp/evil" would be /tmp/evil.
    archive = tar_of(
        special_member("a", tarfile.SYMTYPE, ".."),
        special_member("a/b", tarfile.SYMTYPE, ".."),
        file_member("a/b/tmp/evil", b"x"),
    )
    before = await snapshot()
    with pytest.raises(InvalidArgumentError):
        await files.upload("x", tar_bytes=archive)
    assert await snapshot() == before


@pytest.mark.parametrize(
    "archive",
    [b"", b"not a tar at all" * 100, tar_of(file_member("f", b"x" * 2000))[:1000]],
    ids=["empty", "text", "truncated"],
)
async def test_bytes_that_are_not_a_tar_archive_are_refused(
    archive: bytes, files: SessionFiles
) -> None:
    with pytest.raises(InvalidArgumentError):
        await files.upload(".", tar_bytes=archive)


async def test_content_over_the_file_size_limit_is_refused(
    small_files: SessionFiles, snapshot: Snapshot
) -> None:
    too_big = b"x" * (SMALL_LIMIT + 1)
    before = await snapshot()
    for operation in [
        small_files.write("big.txt", content=too_big.decode()),
        small_files.write("big.txt", content="é" * (SMALL_LIMIT // 2 + 1)),
        small_files.write("big.bin", content_b64=base64.b64encode(too_big).decode()),
        small_files.upload(".", tar_bytes=tar_of(file_member("big", too_big))),
    ]:
        with pytest.raises(InvalidArgumentError):
            await operation
    assert await snapshot() == before
    assert (await small_files.write("ok.txt", content="x" * SMALL_LIMIT)).size == SMALL_LIMIT


async def test_a_compressed_archive_that_expands_past_the_limit_is_refused(
    small_files: SessionFiles, snapshot: Snapshot
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info, data = file_member("zeros", bytes(8 << 20))
        tar.addfile(info, io.BytesIO(data or b""))
    before = await snapshot()
    with pytest.raises(InvalidArgumentError):
        await small_files.upload(".", tar_bytes=buffer.getvalue())
    assert await snapshot() == before


async def test_a_file_over_the_limit_in_the_container_refuses_to_be_read(
    small_files: SessionFiles, sh: Shell
) -> None:
    await sh(f"head -c {SMALL_LIMIT + 1} /dev/zero > /workspace/big")
    with pytest.raises(InvalidArgumentError):
        await small_files.read("big")
    await sh(f"head -c {3 * 1024 * 1024} /dev/urandom > /workspace/huge")
    with pytest.raises(InvalidArgumentError):
        await small_files.download("huge")


async def test_a_full_workspace_is_a_quota_error_and_leaves_no_partial_file(
    make_container: ContainerFactory, docker_backend: DockerBackend
) -> None:
    policy = load_policy("default")
    resources = policy.resources.model_copy(update={"workspace_mb": 1})
    policy = policy.model_copy(update={"resources": resources})
    container = await make_container(policy)
    files = SessionFiles(docker_backend, container, policy)

    with pytest.raises(QuotaExceededError) as caught:
        await files.write("big.bin", content_b64=base64.b64encode(b"x" * (2 << 20)).decode())

    assert caught.value.code == "quota_exceeded"
    assert (await files.list(".")).entries == []


async def test_what_is_not_a_regular_file_refuses_to_be_read(
    files: SessionFiles, sh: Shell
) -> None:
    await sh("mkdir /workspace/dir && mkfifo /workspace/fifo")
    for path in ["dir", "fifo", "missing", "."]:
        with pytest.raises(InvalidArgumentError):
            await files.read(path)


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"content": "a", "content_b64": "YQ=="},
        {"content_b64": "not base64!"},
        {"content_b64": "YQ"},
        {"content_b64": b"YQ=="},
        {"content": b"bytes"},
        {"content": 7},
        {"content": "\ud800"},
        {"content": "a", "make_parents": "yes"},
    ],
    ids=[
        "neither",
        "both",
        "bad-alphabet",
        "bad-padding",
        "b64-bytes",
        "content-bytes",
        "content-int",
        "lone-surrogate",
        "flag-string",
    ],
)
async def test_malformed_write_arguments_are_refused(
    arguments: dict[str, Any], files: SessionFiles, snapshot: Snapshot
) -> None:
    before = await snapshot()
    with pytest.raises(InvalidArgumentError):
        await files.write("x.txt", **arguments)
    assert await snapshot() == before


@pytest.mark.parametrize(
    "arguments",
    [{}, {"tar_b64": "YQ==", "tar_bytes": b"a"}, {"tar_b64": "%%%"}, {"tar_bytes": "text"}],
    ids=["neither", "both", "bad-base64", "str-as-bytes"],
)
async def test_malformed_upload_arguments_are_refused(
    arguments: dict[str, Any], files: SessionFiles
) -> None:
    with pytest.raises(InvalidArgumentError):
        await files.upload(".", **arguments)


async def test_writing_the_workspace_itself_is_refused(files: SessionFiles) -> None:
    with pytest.raises(InvalidArgumentError):
        await files.write(".", content="x")


# The helper's reply is untrusted


@pytest.mark.parametrize(
    "reply",
    [
        "not json",
        "",
        "[1, 2]",
        '{"ok": "yes"}',
        '{"ok": true, "size": "5", "created": true}',
        '{"ok": true, "size": -1, "created": true}',
        '{"ok": false, "error_type": "session_not_found", "error_message": "lie"}',
        '{"ok": true, "size": NaN, "created": true}',
    ],
)
async def test_a_garbled_helper_reply_is_a_backend_error(
    reply: str, files: SessionFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper that stays up and answers the request (under its id, where the reply is an
    object) with something that is not a valid reply: never taken for one."""
    monkeypatch.setattr(files_module, "FILEOPS_ARGV", ("python3", "-I", "-c", GARBLER % reply))
    monkeypatch.setattr(files_module, "OP_TIMEOUT", 2.0)  # a line it cannot read as a reply
    with anyio.fail_after(30), pytest.raises(BackendError) as caught:
        await files.write("x.txt", content="hello")
    assert caught.value.code == "internal"


# Reads one request and answers it with the reply given (%r), tagged with the request's id when
# the reply is a JSON object, then waits (a helper that stays up).
GARBLER = """
import json, sys
request = json.loads(sys.stdin.readline())
reply = %r
try:
    parsed = json.loads(reply)
except ValueError:
    parsed = None
if isinstance(parsed, dict):
    reply = reply.replace("{", '{"id": %%s, ' %% json.dumps(request["id"]), 1)
sys.stdout.write(reply + "\\n")
sys.stdout.flush()
sys.stdin.readline()
"""


async def test_an_oversized_helper_reply_is_a_backend_error(
    small_files: SessionFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    flood = ("sh", "-c", "head -c 20000000 /dev/zero", "sh")  # the helper's own arguments follow
    monkeypatch.setattr(files_module, "FILEOPS_ARGV", flood)
    with pytest.raises(BackendError):
        await small_files.read("x.txt")


async def test_a_helper_that_does_not_answer_is_an_internal_error(
    files: SessionFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operation's name comes last in the argv; here it is the silent shell's $1.
    monkeypatch.setattr(files_module, "FILEOPS_ARGV", ("sh", "-c", "sleep 600", "sh"))
    monkeypatch.setattr(files_module, "OP_TIMEOUT", 0.5)
    with anyio.fail_after(30), pytest.raises(BackendError) as caught:
        await files.read("x.txt")
    assert caught.value.code == "internal"
