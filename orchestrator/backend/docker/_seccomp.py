"""The seccomp profile of every session container: an allowlist at least as strict as the
engine's default profile, minus the syscalls a sandbox has no use for.

A profile given with ``--security-opt seccomp=...`` replaces Docker's default instead of adding
to it, so this is an allowlist too: every syscall not named below fails with EPERM. Sessions run
with no capabilities at all, so none of the default profile's capability-conditional rules
(mount, bpf, perf_event_open, ptrace beyond the kernel's checks, module loading, clock setting,
keyrings, kexec, userfaultfd...) has an allow here: those stay refused as by default. On top of
the default, a session is refused:

- io_uring (``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``): a large kernel
  surface with a long record of privilege escalations, which seccomp cannot filter per
  operation; ENOSYS, so runtimes that try it (libuv, tokio, liburing) fall back as on an old
  kernel;
- ``modify_ldt`` (16-bit segments, for DOS emulators), ``remap_file_pages`` (deprecated, emulated
  since Linux 3.16), ``memfd_secret`` and ``process_mrelease``: nothing in a sandbox needs them;
- the 32-bit x86 and x32 ABIs: only native syscalls are in the filter (no 32-bit programs run);
- where Docker releases' defaults differ, the stricter one: ``name_to_handle_at``, the
  ``pkey_*`` calls and ``process_vm_readv``/``writev`` stay refused, as by Docker 20.10's.

tests/docker/test_seccomp.py calls every syscall number under this profile and under the
engine's default, and fails if this one lets through anything the default refuses.

Arguments are filtered as by default: ``clone`` without namespace flags, ``clone3`` answered
ENOSYS (its flags are behind a pointer, so C libraries fall back to ``clone``), ``personality``
for its harmless values, ``socket`` for every family but AF_VSOCK.

The profile is applied by runc. runsc (gVisor) does not apply it to exec'd processes (see
.ci/install-runsc); there gVisor's own kernel is the syscall boundary, and implements no
io_uring.
"""

from __future__ import annotations

import errno
import json
from functools import cache
from typing import Any, Final

__all__ = ["ALLOWED_SYSCALLS", "REFUSED_SYSCALLS", "profile", "profile_json"]

# What ordinary programs use, by purpose. Names that exist only on 32-bit ABIs are kept where
# the default profile has them (the engine skips names the host's architecture does not know).
_FILES = """
    access chdir chmod chown chown32 close close_range copy_file_range creat dup dup2 dup3
    faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat
    fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fremovexattr
    fsetxattr fstat fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futimesat
    getcwd getdents getdents64 getxattr inotify_add_watch inotify_init inotify_init1
    inotify_rm_watch ioctl lchown lchown32 lgetxattr link linkat listxattr llistxattr _llseek
    lremovexattr lseek lsetxattr lstat lstat64 mkdir mkdirat mknod mknodat
    newfstatat open openat openat2 pread64 preadv preadv2 pwrite64 pwritev pwritev2 read
    readahead readlink readlinkat readv removexattr rename renameat renameat2 rmdir sendfile
    sendfile64 setxattr splice stat stat64 statfs statfs64 statx symlink symlinkat sync
    sync_file_range syncfs tee truncate truncate64 umask unlink unlinkat utime utimensat
    utimensat_time64 utimes vmsplice write writev
"""
# Linux AIO (io_submit and friends) is the old interface, filtered by name like any syscall.
_ASYNC_IO = (
    "io_cancel io_destroy io_getevents io_pgetevents io_pgetevents_time64 io_setup io_submit"
)
_EVENTS = """
    epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait
    epoll_wait_old eventfd eventfd2 poll ppoll ppoll_time64 pselect6 pselect6_time64 select
    _newselect signalfd signalfd4 timerfd_create timerfd_gettime timerfd_gettime64
    timerfd_settime timerfd_settime64
"""
_MEMORY = """
    brk madvise membarrier memfd_create mincore mlock mlock2 mlockall mmap mmap2 mprotect mremap
    msync munlock munlockall munmap
"""
_PROCESSES = """
    capget capset execve execveat exit exit_group fork futex futex_time64 futex_waitv getcpu
    getpgid getpgrp getpid getppid getpriority getrandom get_robust_list getrlimit getrusage
    getsid gettid
    get_thread_area ioprio_get ioprio_set landlock_add_rule landlock_create_ruleset
    landlock_restrict_self pidfd_open pidfd_send_signal prctl prlimit64 restart_syscall rseq
    sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
    sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity
    sched_setattr sched_setparam sched_setscheduler sched_yield seccomp setpgid setpriority
    set_robust_list setrlimit setsid set_thread_area set_tid_address sysinfo times ugetrlimit
    uname vfork wait4 waitid waitpid
"""
# Without capabilities these can only switch among the ids a process already has.
_IDENTITIES = """
    getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getresgid
    getresgid32 getresuid getresuid32 getuid getuid32 setfsgid setfsgid32 setfsuid setfsuid32
    setgid setgid32 setgroups setgroups32 setregid setregid32 setresgid setresgid32 setresuid
    setresuid32 setreuid setreuid32 setuid setuid32
"""
_SIGNALS = """
    alarm getitimer kill pause rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo
    rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo setitimer
    sigaltstack sigprocmask sigreturn tgkill tkill
"""
# Reading clocks; setting one needs CAP_SYS_TIME, which no session has.
_TIME = """
    adjtimex clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime
    clock_gettime64 clock_nanosleep clock_nanosleep_time64 gettimeofday nanosleep time
    timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime
    timer_settime64
"""
_NETWORK = """
    accept accept4 bind connect getpeername getsockname getsockopt listen recv recvfrom recvmmsg
    recvmmsg_time64 recvmsg send sendmmsg sendmsg sendto setsockopt shutdown socketcall
    socketpair
"""
_IPC = """
    ipc mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend
    mq_timedsend_time64 mq_unlink msgctl msgget msgrcv msgsnd pipe pipe2 semctl semget semop
    semtimedop semtimedop_time64 shmat shmctl shmdt shmget
"""
# Debuggers (gdb, strace) on the sandbox's own processes; the kernel confines them to the same
# user, and before 4.8 ptrace could skip seccomp, so not there. process_vm_readv/writev stay
# refused, as by the default of Docker 20.10 (they need CAP_SYS_PTRACE there).
_DEBUGGING = "ptrace"
# arch_prctl sets the thread pointer on x86-64; ARM's own calls, as the default allows them.
_ARCH_SPECIFIC: Final = {
    "amd64": "arch_prctl",
    "arm64": "arm_fadvise64_64 arm_sync_file_range sync_file_range2 breakpoint cacheflush set_tls",
}

ALLOWED_SYSCALLS: Final = frozenset(
    " ".join(
        [_FILES, _ASYNC_IO, _EVENTS, _MEMORY, _PROCESSES, _IDENTITIES, _SIGNALS, _TIME]
    ).split()
    + " ".join([_NETWORK, _IPC, _DEBUGGING]).split()
)
# Refused here although the default profile allows them (see the module docstring), and what
# an errno they fail with.
REFUSED_SYSCALLS: Final = {
    "io_uring_setup": errno.ENOSYS,
    "io_uring_enter": errno.ENOSYS,
    "io_uring_register": errno.ENOSYS,
    "modify_ldt": errno.EPERM,
    "remap_file_pages": errno.EPERM,
    "memfd_secret": errno.EPERM,
    "process_mrelease": errno.EPERM,
}
# clone's namespace flags (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): a clone
# asking for any of them is refused, as unshare and setns are.
_CLONE_NAMESPACE_FLAGS = 0x7E020000
# personality(): Linux, PER_LINUX32, UNAME26, both, and the query 0xffffffff; anything else
# (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) would weaken the process's own protections.
_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
_AF_VSOCK = 40


def _allow(names: list[str], **fields: Any) -> dict[str, Any]:
    return {"names": sorted(names), "action": "SCMP_ACT_ALLOW", **fields}


@cache
def profile() -> dict[str, Any]:
    """The profile, in the engine's JSON format."""
    rules = [
        _allow(sorted(ALLOWED_SYSCALLS - set(_DEBUGGING.split()))),
        _allow(_DEBUGGING.split(), includes={"minKernel": "4.8"}),
        *(
            _allow(["personality"], args=[{"index": 0, "value": value, "op": "SCMP_CMP_EQ"}])
            for value in _PERSONALITIES
        ),
        _allow(["socket"], args=[{"index": 0, "value": _AF_VSOCK, "op": "SCMP_CMP_NE"}]),
        _allow(
            ["clone"],
            args=[{"index": 0, "value": _CLONE_NAMESPACE_FLAGS, "op": "SCMP_CMP_MASKED_EQ"}],
        ),
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        *(
            _allow(names.split(), includes={"arches": [arch]})
            for arch, names in _ARCH_SPECIFIC.items()
        ),
        *(
            {"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": code}
            for name, code in REFUSED_SYSCALLS.items()
        ),
    ]
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        # Native syscalls only: no 32-bit x86, x32 or 32-bit ARM entry points.
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": []},
        ],
        "syscalls": rules,
    }


@cache
def profile_json() -> str:
    """The profile as the compact JSON string ``security_opt`` takes."""
    return json.dumps(profile(), separators=(",", ":"), sort_keys=True)
