"""The session seccomp profile (``backend/docker/_seccomp``) replaces the engine's default: proven
at least as strict by calling every syscall number under both, io_uring refused, and ordinary
work (Python, threads, subprocesses, a shell) untouched under runc."""

from __future__ import annotations

import json
import platform
from typing import Any

import pytest

import orchestrator.backend.docker._spec as spec_module
from orchestrator._api import Orchestrator
from orchestrator.backend.docker import DockerBackend
from orchestrator.backend.docker._seccomp import profile
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy, shipped_policy_names
from tests.conftest import ContainerFactory
from tests.docker.test_posture import run_python
from tests.docker.test_python_repl import config

pytestmark = [
    pytest.mark.docker,
    pytest.mark.anyio,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers of x86-64"),
]

# Every syscall number of x86-64 (up to 470 on Linux 6.x), each in a child of its own with all
# six arguments -1 (bad pointers, fds, flags: nothing can take effect) and a 2 s alarm; fork and
# vfork are left out, their children would run this loop too. Prints {number: outcome}.
EVERY_SYSCALL = """
import ctypes, errno, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
seen = {}
for number in range(471):
    if number in (57, 58):
        continue
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        signal.alarm(2)
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(-1)] * 6)
        os.write(write_end, str(ctypes.get_errno() if result == -1 else 0).encode())
        os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 64)
    os.close(read_end)
    os.waitpid(pid, 0)
    seen[number] = errno.errorcode.get(int(answer), answer.decode()) if answer else "ended"
print(json.dumps(seen))
"""
REFUSED = ("EPERM", "ENOSYS")
REFUSED_BEYOND_THE_DEFAULT = {
    425: "io_uring_setup",
    426: "io_uring_enter",
    427: "io_uring_register",
    154: "modify_ldt",
    216: "remap_file_pages",
    447: "memfd_secret",
    448: "process_mrelease",
    303: "name_to_handle_at",
    310: "process_vm_readv",
    311: "process_vm_writev",
    329: "pkey_mprotect",
    330: "pkey_alloc",
    331: "pkey_free",
}

IO_URING_SETUP = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
ctypes.set_errno(0)
result = libc.syscall(425, 8, params)
errno.errorcode.get(ctypes.get_errno(), "allowed") if result < 0 else "allowed"
"""
ORDINARY_WORK = """
import concurrent.futures, hashlib, json, os, socket, subprocess, tempfile
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    digests = list(pool.map(lambda n: hashlib.sha256(bytes(n)).hexdigest()[:8], range(4)))
shell = subprocess.run(["sh", "-c", "echo $((6 * 7)) | cat"], capture_output=True, text=True)
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "f")
    with open(path, "w") as handle:
        handle.write("x")
    os.chmod(path, 0o600)
    size = os.stat(path).st_size
left, right = socket.socketpair()
left.sendall(b"ping")
json.dumps([len(digests), shell.stdout.strip(), size, right.recv(4).decode()])
"""


def syscall_outcomes(stdout: str) -> dict[int, str]:
    return {int(number): outcome for number, outcome in json.loads(stdout).items()}


async def test_the_profile_refuses_every_syscall_the_default_refuses_and_io_uring(
    docker_backend: DockerBackend,
    make_container: ContainerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = load_policy("default")
    ours = await make_container(policy)
    monkeypatch.setattr(spec_module, "SECCOMP_OPTIONS", ())
    default = await make_container(policy)
    results = []
    for container_id in (ours, default):
        code, out, err = await run_python(docker_backend, container_id, EVERY_SYSCALL, timeout=120)
        assert code == 0, err
        results.append(syscall_outcomes(out))
    under_ours, under_default = results

    weaker = {
        number: (under_default[number], under_ours[number])
        for number in under_default
        if under_default[number] in REFUSED and under_ours[number] not in REFUSED
    }
    assert weaker == {}
    stricter = {n for n in under_default if under_ours[n] in REFUSED} - {
        n for n in under_default if under_default[n] in REFUSED
    }
    # Only what the profile means to refuse beyond the default (newer engines' defaults allow
    # name_to_handle_at, process_vm_readv/writev and pkey_*, which Docker 20.10's refuses).
    assert stricter <= set(REFUSED_BEYOND_THE_DEFAULT), sorted(stricter)
    io_uring = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register
    assert [under_ours[n] for n in io_uring] == ["ENOSYS"] * 3
    assert all(under_default[n] not in REFUSED for n in io_uring)  # why the profile exists


async def test_a_session_cannot_set_up_io_uring_and_ordinary_work_runs(
    worker_image: ImageBuildResult,
) -> None:
    async with Orchestrator(config(worker_image.tag)) as orch:

        async def run(code: str, **extra: Any) -> dict[str, Any]:
            answer = await orch.call("python_repl", {"operation": "execute", "code": code, **extra})
            assert answer.structured["success"], answer.structured
            return answer.structured

        first = await run(IO_URING_SETUP, policy="unrestricted-python")
        assert first["result_repr"] == "'ENOSYS'"
        work = await run(ORDINARY_WORK, session_id=first["session_id"])
        assert json.loads(eval(work["result_repr"])) == [4, "42", 1, "ping"]
        shell = await orch.call(
            "terminal",
            {"operation": "run", "session_id": first["session_id"], "command": "ls / | wc -l"},
        )
        assert shell.structured["exit_code"] == 0 and int(shell.structured["stdout"]) > 5


@pytest.mark.parametrize("policy_name", shipped_policy_names())
async def test_every_session_container_gets_the_profile(
    policy_name: str, docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    container_id = await make_container(load_policy(policy_name))
    options = (await docker_backend.inspect(container_id))["HostConfig"]["SecurityOpt"]
    seccomp = [option for option in options if option.startswith("seccomp=")]
    assert [json.loads(option.removeprefix("seccomp=")) for option in seccomp] == [profile()]
