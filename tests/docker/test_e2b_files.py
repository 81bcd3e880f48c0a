"""E2B's files API as the unmodified SDK (``e2b`` 2.63, pinned) sees it against a real
``sandhold serve --e2b-port``: ``get_info`` with every field envd fills, symlinks shown as what
they point at, removing what is not there, file metadata (``user.e2b.*`` extended attributes:
set on upload, kept by a rename, cleared by an overwrite, set in the sandbox by hand), directory
watches (the watcher calls the sync SDK makes and the ``WatchDir`` stream the async one reads:
create, write, chmod, remove and rename events, recursive ones in directories made later,
entries with the events), signed download and upload URLs (with and past their expiration, and
forged), and the commands row: a PTY and a command with a cwd outside the home, a command
whose sandbox is killed under it, and the async SDK's command timeout (enforced by the server)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import PtySize

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

pytestmark = pytest.mark.docker

# A bound on waiting for an async watch's events to arrive (they come within ~50 ms).
EVENT_WAIT = 30.0


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-files")) as running:
        yield running


@pytest.fixture
def sandbox(server: E2bServer) -> Iterator[Sandbox]:
    made = Sandbox.create()
    try:
        yield made
    finally:
        made.kill()


def kinds(events: list[FilesystemEvent], name: str) -> list[FilesystemEventType]:
    return [event.type for event in events if event.name == name]


def test_get_info_fills_every_field_envd_does(sandbox: Sandbox) -> None:
    sandbox.files.write("info.txt", "test")
    info = sandbox.files.get_info("info.txt")
    assert (info.name, info.type, info.path) == ("info.txt", FileType.FILE, "/home/user/info.txt")
    assert (info.size, info.mode, info.permissions) == (4, 0o644, "-rw-r--r--")
    assert (info.owner, info.group) == ("user", "user")
    assert info.modified_time.tzinfo is not None
    assert abs(info.modified_time.timestamp() - time.time()) < 3600
    assert info.symlink_target is None and info.metadata is None

    assert sandbox.files.make_dir("d") is True
    folder = sandbox.files.get_info("d")
    assert (folder.type, folder.mode, folder.permissions) == (FileType.DIR, 0o755, "drwxr-xr-x")
    assert folder.size > 0 and folder.path == "/home/user/d"

    home = sandbox.files.get_info("/home/user")
    assert (home.name, home.type, home.path) == ("user", FileType.DIR, "/home/user")

    for missing in ("nothing.txt", "no/such/dir"):
        with pytest.raises(FileNotFoundException):
            sandbox.files.get_info(missing)


def test_a_symlink_shows_what_it_points_at_and_its_absolute_target(sandbox: Sandbox) -> None:
    sandbox.files.write("links/target.txt", "Hello")
    sandbox.commands.run("ln -s target.txt to-file && ln -s . to-dir", cwd="/home/user/links")
    sandbox.commands.run("ln -s gone.txt dangling", cwd="/home/user/links")
    to_file = sandbox.files.get_info("links/to-file")
    assert to_file.type == FileType.FILE
    assert to_file.symlink_target == "/home/user/links/target.txt"
    to_dir = sandbox.files.get_info("links/to-dir")
    assert (to_dir.type, to_dir.symlink_target) == (FileType.DIR, "/home/user/links")
    dangling = sandbox.files.get_info("links/dangling")
    assert (dangling.type, dangling.symlink_target) == (FileType.FILE, "/home/user/links/gone.txt")
    listed = {e.name: (e.type, e.symlink_target) for e in sandbox.files.list("links")}
    assert listed["to-file"] == (FileType.FILE, "/home/user/links/target.txt")
    assert listed["target.txt"] == (FileType.FILE, None)


def test_removing_what_is_not_there_is_no_error_and_a_tree_goes_whole(sandbox: Sandbox) -> None:
    sandbox.files.remove("never-there.txt")
    sandbox.files.remove("never/there")
    sandbox.files.write("tree/a/b.txt", "x")
    sandbox.files.remove("tree")
    assert not sandbox.files.exists("tree")


def test_metadata_is_kept_with_the_file_as_envd_keeps_it(sandbox: Sandbox) -> None:
    meta = {"author": "mish", "purpose": "upload"}
    written = sandbox.files.write("m.txt", "content", metadata=meta)
    assert written.metadata == meta
    assert sandbox.files.get_info("m.txt").metadata == meta
    octet = sandbox.files.write("m2.txt", "content", metadata=meta, use_octet_stream=True)
    assert octet.metadata == meta and sandbox.files.get_info("m2.txt").metadata == meta
    # Keys are lowercased, as envd keeps them.
    assert sandbox.files.write("m3.txt", "c", metadata={"Tag": "X"}).metadata == {"tag": "X"}

    listed = {e.name: e.metadata for e in sandbox.files.list("/home/user")}
    assert listed["m.txt"] == meta and listed["m3.txt"] == {"tag": "X"}
    assert sandbox.files.rename("m.txt", "moved.txt").metadata == meta
    assert sandbox.files.write("moved.txt", "again").metadata is None
    assert sandbox.files.get_info("moved.txt").metadata is None

    # Set in the sandbox by hand, in the namespace envd reads.
    sandbox.files.write("by-hand.txt", "x")
    sandbox.commands.run(
        "python3 -c \"import os; os.setxattr('by-hand.txt', 'user.e2b.author', b'me');"
        " os.setxattr('by-hand.txt', 'user.other', b'not shown')\""
    )
    assert sandbox.files.get_info("by-hand.txt").metadata == {"author": "me"}


def test_metadata_the_sdk_would_not_send_is_refused_by_the_server(
    sandbox: Sandbox, server: E2bServer
) -> None:
    url = sandbox.upload_url("bad.txt")
    request = urllib.request.Request(
        url, data=b"x", method="POST",
        headers={"Content-Type": "application/octet-stream", "X-Metadata-ok": "bad\x7fvalue"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert not sandbox.files.exists("bad.txt")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("bad.txt", "x", metadata={"bad key": "v"})


def test_a_watch_reports_create_write_remove_and_rename(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("w")
    sandbox.files.write("w/old.txt", "before")
    handle = sandbox.files.watch_dir("w")
    assert handle.get_new_events() == []
    sandbox.files.write("w/new.txt", "made")
    made = handle.get_new_events()
    # The file helper writes through a temporary file: its events read as the file's own.
    assert [e.name for e in made] == ["new.txt"] * 3
    assert made[0].type == FilesystemEventType.CREATE
    assert {e.type for e in made} == {
        FilesystemEventType.CREATE, FilesystemEventType.WRITE, FilesystemEventType.CHMOD
    }  # fmt: skip
    sandbox.files.write("w/old.txt", "after")
    assert FilesystemEventType.WRITE in kinds(handle.get_new_events(), "old.txt")
    sandbox.commands.run("mv w/old.txt w/renamed.txt && rm w/new.txt && echo x >> w/renamed.txt")
    events = handle.get_new_events()
    assert kinds(events, "old.txt") == [FilesystemEventType.RENAME]
    assert kinds(events, "renamed.txt") == [FilesystemEventType.CREATE, FilesystemEventType.WRITE]
    assert kinds(events, "new.txt") == [FilesystemEventType.REMOVE]
    sandbox.files.write("w/sub/deep.txt", "not watched: not recursive")
    assert [e.name for e in handle.get_new_events()] == ["sub"]
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_a_recursive_watch_follows_directories_made_after_it_with_entries(
    sandbox: Sandbox,
) -> None:
    sandbox.files.make_dir("r/nested")
    handle = sandbox.files.watch_dir("r", recursive=True, include_entry=True)
    sandbox.files.write("r/nested/a.txt", "a")
    events = handle.get_new_events()
    assert [e.name for e in events] == ["nested/a.txt"] * 3
    assert events[0].type == FilesystemEventType.CREATE
    entry = events[0].entry
    assert entry is not None and entry.path == "/home/user/r/nested/a.txt"
    assert (entry.name, entry.type, entry.size) == ("a.txt", FileType.FILE, 1)
    sandbox.files.make_dir("r/later/deeper")
    sandbox.files.write("r/later/deeper/b.txt", "b")
    later = handle.get_new_events()
    assert FilesystemEventType.CREATE in kinds(later, "later")
    assert FilesystemEventType.WRITE in kinds(later, "later/deeper/b.txt")
    sandbox.files.remove("r/nested/a.txt")
    gone = handle.get_new_events()
    assert [(e.name, e.type, e.entry) for e in gone] == [
        ("nested/a.txt", FilesystemEventType.REMOVE, None)
    ]
    handle.stop()


def test_watching_what_is_not_a_directory_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir("no-such-dir")
    sandbox.files.write("plain.txt", "x")
    with pytest.raises(SandboxException):
        sandbox.files.watch_dir("plain.txt")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir("/etc")


def test_one_sandboxes_watcher_is_not_found_from_another(server: E2bServer) -> None:
    first, second = Sandbox.create(), Sandbox.create()
    try:
        handle = first.files.watch_dir("/home/user")
        asked = httpx.post(
            server.url + "/filesystem.Filesystem/GetWatcherEvents",
            json={"watcherId": handle._watcher_id},
            headers={
                "E2b-Sandbox-Id": second.sandbox_id,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": second._envd_access_token or "",
            },
            timeout=30,
        )
        assert asked.status_code == 404 and asked.json()["code"] == "not_found"
        first.files.write("still.txt", "mine")
        assert kinds(handle.get_new_events(), "still.txt")
    finally:
        first.kill()
        second.kill()


def test_the_async_sdk_streams_a_watch_and_it_ends_with_the_stream(server: E2bServer) -> None:
    async def scenario() -> list[tuple[str, FilesystemEventType]]:
        made = await AsyncSandbox.create()
        try:
            seen: list[FilesystemEvent] = []
            three = asyncio.Event()

            def on_event(event: FilesystemEvent) -> None:
                seen.append(event)
                if len(seen) >= 3:
                    three.set()

            handle = await made.files.watch_dir("/home/user", on_event=on_event)
            await made.files.write("streamed.txt", "x")
            await asyncio.wait_for(three.wait(), EVENT_WAIT)
            await handle.stop()
            return [(e.name, e.type) for e in seen]
        finally:
            await made.kill()

    events = asyncio.run(scenario())
    assert [name for name, _ in events] == ["streamed.txt"] * 3
    assert events[0][1] == FilesystemEventType.CREATE


def test_signed_urls_download_and_upload_until_they_expire(sandbox: Sandbox) -> None:
    sandbox.files.write("signed.txt", "signed content")
    with urllib.request.urlopen(sandbox.download_url("signed.txt"), timeout=30) as got:
        assert got.read() == b"signed content"
    with urllib.request.urlopen(sandbox.download_url("signed.txt", "user", 120), timeout=30) as got:
        assert got.read() == b"signed content"
    upload = urllib.request.Request(
        sandbox.upload_url("uploaded.txt"), data=b"by url", method="POST",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    with urllib.request.urlopen(upload, timeout=30) as sent:
        assert json.loads(sent.read())[0]["path"] == "/home/user/uploaded.txt"
    assert sandbox.files.read("uploaded.txt") == "by url"

    expired = sandbox.download_url("signed.txt", "user", use_signature_expiration=-120)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(expired, timeout=30)
    assert refused.value.code == 401
    assert json.loads(refused.value.read()) == {
        "code": 401, "message": "signature is already expired"
    }  # fmt: skip

    # A signature for another path, or another operation, names no sandbox.
    forged = sandbox.download_url("signed.txt").replace("signed.txt", "other.txt", 1)
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(forged, timeout=30)
    assert unknown.value.code == 401
    wrong_operation = urllib.request.Request(
        sandbox.download_url("signed.txt"), data=b"x", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused_write:
        urllib.request.urlopen(wrong_operation, timeout=30)
    assert refused_write.value.code == 401
    assert sandbox.files.read("signed.txt") == "signed content"


def test_a_pty_and_a_command_run_in_a_directory_outside_the_home(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    output: list[bytes] = []
    terminal = sandbox.pty.create(PtySize(24, 80), envs={"ABC": "123"}, cwd="/")
    sandbox.pty.send_stdin(terminal.pid, b"echo $ABC; pwd\nexit\n")
    assert terminal.wait(on_pty=output.append).exit_code == 0
    shown = b"".join(output).decode()
    assert "123" in shown and "\n/\r\n" in shown.replace("\r\r", "\r")


def test_a_command_whose_sandbox_is_killed_under_it_ends_with_an_error_at_once(
    server: E2bServer,
) -> None:
    made = Sandbox.create()
    # Longer than the test's timeout: a stream not cut when the sandbox ends fails the test.
    command = made.commands.run("sleep 3600", background=True)
    made.kill()
    # The stream's connection is reset, as E2B's proxy resets it: the SDK then finds the
    # sandbox gone and says so (a close would read as a malformed answer, "timeout").
    with pytest.raises(TimeoutException, match="killed"):
        command.wait()
    assert not made.is_running()


def test_the_async_sdks_command_timeout_ends_its_stream(server: E2bServer) -> None:
    """The async SDK leaves the command's timeout to the server (``connect-timeout-ms``)."""

    async def scenario() -> None:
        made = await AsyncSandbox.create()
        try:
            # Longer than the test's timeout: a stream not ended at its deadline fails the test.
            with pytest.raises(TimeoutException):
                await made.commands.run("sleep 3600", timeout=2)
            assert (await made.commands.run("echo still")).stdout == "still\n"
        finally:
            await made.kill()

    asyncio.run(scenario())
