"""Runs inside a session container (stdlib only) and prints, as JSON, what the sandbox looks like
from within: privileges, filesystems, limits, network, sockets."""

import json
import os
import resource
import stat


def status_fields():
    fields = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def size_of(path):
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def root_writable():
    try:
        with open("/sandhold-probe", "w") as handle:
            handle.write("x")
    except OSError as exc:
        return exc.errno
    return 0


def sockets_anywhere():
    found = []
    for top in ("/", "/run", "/var/run", "/tmp", "/workspace", "/home"):
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in ("/proc", "/sys")]
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    mode = os.lstat(path).st_mode
                except OSError:
                    continue
                if stat.S_ISSOCK(mode) or "docker.sock" in name:
                    found.append(path)
        if top == "/":
            break
    return sorted(set(found))


def first_readable(*paths):
    for path in paths:
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            continue
    return None


status = status_fields()
print(
    json.dumps(
        {
            "uid": os.getuid(),
            "gid": os.getgid(),
            "euid": os.geteuid(),
            "groups": os.getgroups(),
            "cap_eff": status.get("CapEff"),
            "cap_prm": status.get("CapPrm"),
            "cap_bnd": status.get("CapBnd"),
            "no_new_privs": status.get("NoNewPrivs"),
            "seccomp": status.get("Seccomp"),
            "root_write_errno": root_writable(),
            "sizes": {p: size_of(p) for p in ("/tmp", "/workspace", "/home/sandbox", "/dev/shm")},
            "net": sorted(os.listdir("/sys/class/net")),
            "sockets": sockets_anywhere(),
            "rlimits": {
                "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
                "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
                "core": resource.getrlimit(resource.RLIMIT_CORE),
            },
            "memory_limit": first_readable(
                "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"
            ),
            "pids_max": first_readable("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
            "pid1": first_readable("/proc/1/comm"),
        }
    )
)
