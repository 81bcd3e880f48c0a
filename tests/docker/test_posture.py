"""The boundary, proven per shipped policy: from inside a real container and from the engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.backend.base import ExecSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.errors import BackendUnavailableError
from orchestrator.policy.model import Policy, load_policy, shipped_policy_names
from tests.conftest import ContainerFactory

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1024 * 1024
PROBE = (Path(__file__).parent / "probes" / "posture.py").read_text()
POLICIES = shipped_policy_names()


async def run_python(
    backend: DockerBackend, container_id: str, source: str, *, timeout: float = 60
) -> tuple[int | None, str, str]:
    result = await backend.run(
        container_id,
        ExecSpec(argv=["python3", "-I", "-c", source]),
        timeout=timeout,
        max_output_bytes=1 * MIB,
    )
    return result.exit_code, result.stdout.decode(), result.stderr.decode()


@pytest.mark.parametrize("policy_name", POLICIES)
async def test_inside_the_container_nothing_is_privileged_and_every_limit_holds(
    policy_name: str, docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy(policy_name)
    container_id = await make_container(policy)
    code, out, err = await run_python(docker_backend, container_id, PROBE)
    assert code == 0, err
    seen = json.loads(out)
    res = policy.resources

    assert (seen["uid"], seen["gid"], seen["euid"]) == (10001, 10001, 10001)
    assert int(seen["cap_eff"], 16) == 0
    assert int(seen["cap_prm"], 16) == 0
    assert int(seen["cap_bnd"], 16) == 0
    assert seen["no_new_privs"] == "1"
    assert seen["seccomp"] == "2"
    assert seen["root_write_errno"] == 30  # EROFS
    assert seen["sizes"]["/tmp"] == res.tmp_mb * MIB
    assert seen["sizes"]["/workspace"] == res.workspace_mb * MIB
    assert seen["sizes"]["/home/sandbox"] == res.home_mb * MIB
    assert seen["sizes"]["/dev/shm"] == res.shm_mb * MIB
    # A policy with egress gets one interface more: on its session's own network, whose only
    # other member is its proxy (tests/docker/test_egress*.py); every other has loopback alone.
    assert seen["net"] == (["lo"] if policy.network.mode == "none" else ["eth0", "lo"])
    assert seen["sockets"] == []
    assert seen["rlimits"]["nofile"] == [res.nofile, res.nofile]
    assert seen["rlimits"]["fsize"] == [res.fsize_mb * MIB, res.fsize_mb * MIB]
    assert seen["rlimits"]["core"] == [0, 0]
    assert int(seen["memory_limit"]) == res.memory_mb * MIB
    assert int(seen["pids_max"]) == res.pids
    assert seen["pid1"] == "docker-init"


@pytest.mark.parametrize("policy_name", POLICIES)
async def test_the_engine_shows_the_host_config_the_policy_asks_for(
    policy_name: str, docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy(policy_name)
    container_id = await make_container(policy)
    info = await docker_backend.inspect(container_id)
    host, config = info["HostConfig"], info["Config"]
    res = policy.resources

    assert config["User"] == "10001:10001"
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert host["Privileged"] is False
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert not any("unconfined" in opt for opt in host["SecurityOpt"])
    assert host["ReadonlyRootfs"] is True
    assert set(host["Tmpfs"]) == {"/tmp", "/workspace", "/home/sandbox"}
    assert f"size={res.tmp_mb}m" in host["Tmpfs"]["/tmp"]
    if policy.network.mode == "none":
        assert host["NetworkMode"] == "none"
    else:  # its session's own network, on which the host is not (backend/docker/_egress_net)
        assert host["NetworkMode"].startswith("sandhold-egress-")
        name = host["NetworkMode"]
        network = await docker_backend.client.call(lambda sdk: sdk.networks.get(name))
        assert network.attrs["Driver"] == "macvlan"
        link = await docker_backend.client.call(lambda sdk: sdk.networks.get(f"{name}-link"))
        assert network.attrs["Options"]["parent"] == f"br-{link.id[:12]}"
        assert link.attrs["Internal"] is True
        assert link.attrs["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    assert host["Memory"] == host["MemorySwap"] == res.memory_mb * MIB
    assert host["NanoCpus"] == int(res.cpus * 1e9)
    assert host["PidsLimit"] == res.pids
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    assert ulimits == {
        "nofile": (res.nofile, res.nofile),
        "fsize": (res.fsize_mb * MIB, res.fsize_mb * MIB),
        "core": (0, 0),
    }
    assert host["Init"] is True
    assert host["RestartPolicy"]["Name"] == "no"
    assert host["LogConfig"]["Type"] == "none"
    assert not host.get("Binds")
    assert not info.get("Mounts")
    assert not host.get("Devices")
    labels = config["Labels"]
    assert labels["sandhold.policy-hash"] == policy.hash
    assert {"sandhold.session", "sandhold.tenant", "sandhold.orchestrator"} <= set(labels)


def _tight(policy: Policy, **resources: int) -> Policy:
    return policy.model_copy(update={"resources": policy.resources.model_copy(update=resources)})


FORK_BOMB = """
import os, sys
children = []
try:
    for _ in range(10000):
        pid = os.fork()
        if pid == 0:
            import time
            time.sleep(30)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print(len(children), exc.errno)
for pid in children:
    os.kill(pid, 9)
for pid in children:
    os.waitpid(pid, 0)
"""


async def test_a_fork_bomb_is_held_by_the_pids_limit(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = _tight(load_policy("default"), pids=32)
    container_id = await make_container(policy)
    code, out, err = await run_python(docker_backend, container_id, FORK_BOMB)
    assert code == 0, err
    forked, errno = map(int, out.split())
    assert errno == 11  # EAGAIN: the pids cgroup refused the next fork
    assert forked < 32
    code, out, _ = await run_python(docker_backend, container_id, "print('alive')")
    assert (code, out.strip()) == (0, "alive")


WRITE_PAST_FSIZE = """
import errno
try:
    with open('/workspace/big', 'wb') as f:
        f.write(b'x' * ({fsize} + 1))
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""

FILL_TMPFS = """
import errno
chunk = b'x' * (1024 * 1024)
try:
    for i in range(100000):
        with open(f'/tmp/fill-{{i}}', 'wb') as f:
            f.write(chunk)
except OSError as exc:
    print(errno.errorcode[exc.errno], i)
"""


async def test_writing_past_fsize_fails_inside_the_container(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = _tight(load_policy("default"), fsize_mb=4)
    container_id = await make_container(policy)
    source = WRITE_PAST_FSIZE.format(fsize=4 * MIB)
    code, out, err = await run_python(docker_backend, container_id, source)
    assert (code, out.strip()) == (0, "EFBIG"), err


async def test_filling_a_tmpfs_fails_with_no_space_inside_the_container(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = _tight(load_policy("default"), tmp_mb=8)
    container_id = await make_container(policy)
    code, out, err = await run_python(docker_backend, container_id, FILL_TMPFS.format())
    assert code == 0, err
    reason, files_written = out.split()
    assert reason == "ENOSPC"
    assert int(files_written) <= 8


async def test_a_memory_bomb_is_oom_killed_reported_as_such_and_the_container_lives_on(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = _tight(load_policy("default"), memory_mb=64)
    container_id = await make_container(policy)
    started = time.time()
    code, _, _ = await run_python(docker_backend, container_id, "b = b'x' * (256 * 1024 * 1024)")
    assert code == 137  # SIGKILL
    assert await docker_backend.oom_kills(container_id, since=started - 1, until=time.time()) >= 1
    assert (await docker_backend.container_state(container_id)).running
    code, out, _ = await run_python(docker_backend, container_id, "print('alive')")
    assert (code, out.strip()) == (0, "alive")


async def test_a_policy_asking_for_runsc_is_refused_clearly_when_the_engine_lacks_it(
    docker_backend: DockerBackend, make_container: ContainerFactory
) -> None:
    policy = load_policy("default").model_copy(update={"runtime": "runsc"})
    if "runsc" in await docker_backend.runtimes():
        container_id = await make_container(policy)
        info = await docker_backend.inspect(container_id)
        assert info["HostConfig"]["Runtime"] == "runsc"
        return
    with pytest.raises(BackendUnavailableError, match="runsc") as caught:
        await make_container(policy)
    assert caught.value.code == "backend_unavailable"
    assert caught.value.hint
