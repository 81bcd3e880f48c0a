"""The start of every exec in a session Pod: a few lines of Python (stdlib, run by the image's
python3) between the API server's exec and the command, doing what a CRI exec cannot be told:

- the exec's environment and working directory (an exec takes only argv);
- the policy's per-process limits (``nofile``, ``fsize``, no core files), lowered hard as well
  as soft, which the sandbox user can never raise again: Docker's ``ulimits``;
- a session and process group of the command's own, whose id is its pid, as Docker's exec gives
  (``session/signals.py`` signals groups by that pid);
- on the ``v4`` channel protocol, which cannot close an exec's stdin, an end of input: stdin
  arrives framed (4-byte big-endian length, then the bytes; length 0 is the end) and is passed
  to the command through a pipe that is closed at the end (``pipe`` mode). With ``v5``, or a
  TTY, the relay replaces itself with the command (``exec`` mode): nothing stays between.

The exit status is the command's (128 + the signal when one killed it); a command that cannot be
started exits 127 (not found) or 126, as a shell's would.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

__all__ = ["FRAME", "RELAY", "relay_argv"]

FRAME = struct.Struct(">I")

RELAY = r"""
import os, resource, struct, sys, threading

def start(argv, env):
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write("sandhold: cannot run %s: %s\n" % (argv[0], exc.strerror))
        sys.stderr.flush()
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)

def read_exact(size):
    data = b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data

def feed(pipe):
    try:
        while True:
            header = read_exact(4)
            size = struct.unpack(">I", header)[0] if header else 0
            data = read_exact(size) if size else None
            if not data:
                break
            while data:
                data = data[os.write(pipe, data):]
    except OSError:
        pass
    finally:
        os.close(pipe)

mode, nofile, fsize, workdir, count = sys.argv[1:6]
count = int(count)
env = dict(os.environ)
for item in sys.argv[6:6 + count]:
    key, _, value = item.partition("=")
    env[key] = value
argv = sys.argv[6 + count:]
for limit, value in ((resource.RLIMIT_NOFILE, int(nofile)), (resource.RLIMIT_FSIZE, int(fsize)),
                     (resource.RLIMIT_CORE, 0)):
    if value >= 0:
        resource.setrlimit(limit, (value, value))
os.chdir(workdir)
if mode == "exec":
    try:
        os.setsid()
    except OSError:
        pass
    start(argv, env)
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(write_end)
    os.dup2(read_end, 0)
    os.close(read_end)
    os.setsid()
    start(argv, env)
os.close(read_end)
threading.Thread(target=feed, args=(write_end,), daemon=True).start()
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)
"""


def relay_argv(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: str,
    nofile: int,
    fsize_bytes: int,
    pipe: bool,
) -> list[str]:
    """The argv of an exec that runs ``argv`` through the relay (``pipe``: framed stdin)."""
    pairs = [f"{key}={value}" for key, value in env.items()]
    return [
        "python3",
        "-I",
        "-c",
        RELAY,
        "pipe" if pipe else "exec",
        str(nofile),
        str(fsize_bytes),
        workdir,
        str(len(pairs)),
        *pairs,
        *argv,
    ]
