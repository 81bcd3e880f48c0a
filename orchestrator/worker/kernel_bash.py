"""The bash kernel: one long-lived ``bash`` whose variables, functions, exports and cwd last from
cell to cell, behind the worker protocol (kernel.py).

Each cell is written to a file of the kernel's own and sourced (``.``) with stdin from
/dev/null, so a cell can never read the commands that follow it; after it, bash prints a marker
made of a random token (never shown to the cell) and the cell's status on stdout, and the token
on stderr: output up to the markers is the cell's. A non-zero status is the cell's error
(``ExitCode``), as Jupyter's bash kernel reports it. A cell's env is given as assignments before
the ``.``, which bash keeps for that command only (and exports to its children).

SIGINT (the host's timeout) goes to bash's whole process group: the command running dies, and
bash's ``trap`` returns from the sourced cell, its state kept. bash dies with the kernel
(PR_SET_PDEATHSIG), so a kernel SIGKILLed after the grace leaves no shell behind.
"""

import ctypes
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

if __name__ == "__main__" and not __package__:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

import contextlib

from .config import WorkerConfig
from .kernel import Sink, run
from .kernel_pipes import collect, cpu_seconds, wait_ended, with_output

BASH_ARGV = ("bash", "--norc", "--noprofile")
# Set once at start: an interrupted cell returns from its ``.`` with the status of a SIGINT.
PRELUDE = "trap 'return 130 2>/dev/null' INT\n"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class BashAdapter:
    def __init__(self, config: WorkerConfig) -> None:
        self._limit = config.max_stream_bytes
        self._dir = tempfile.mkdtemp(prefix="sandhold-bash-")
        self._cell = os.path.join(self._dir, "cell.sh")
        self._token = secrets.token_hex(16).encode()
        self._process = subprocess.Popen(
            BASH_ARGV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._write(PRELUDE.encode())
        found = subprocess.run(
            ["bash", "-c", "echo $BASH_VERSION"], capture_output=True, text=True, check=False
        )
        self.version = "bash " + found.stdout.strip()[:48]
        self._running = False

    def alive(self) -> bool:
        return self._process.poll() is None

    def _write(self, data: bytes) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def set_env(self, env: "dict[str, str]") -> None:
        exports = "".join(
            f"export {name}={shlex.quote(value)}\n"
            for name, value in env.items()
            if _NAME.match(name)
        )
        self._write(exports.encode())

    def interrupt(self) -> None:
        if self._running:
            with contextlib.suppress(OSError):
                os.killpg(self._process.pid, signal.SIGINT)

    def execute(self, code: str, env: "dict[str, str]", sink: Sink | None) -> "dict[str, Any]":
        bad = [name for name in env if not _NAME.match(name)]
        started, cpu = time.perf_counter(), cpu_seconds(self._process.pid)
        if bad:
            return _reply(False, "validation", f"not a shell variable name: {bad[0][:64]!r}")
        with open(self._cell, "w", encoding="utf-8", errors="surrogateescape") as cell:
            cell.write(code if code.endswith("\n") else code + "\n")
        assignments = "".join(f"{n}={shlex.quote(v)} " for n, v in env.items())
        token = self._token.decode()
        command = (
            f"{assignments}. {shlex.quote(self._cell)} </dev/null; "
            f"printf '%s%d\\n' {token} \"$?\"; printf '%s\\n' {token} >&2\n"
        )
        self._running = True
        try:
            self._write(command.encode())
            streams, status = self._collect(sink)
        except OSError:
            streams, status = self._collect(sink)
        finally:
            self._running = False
        reply = _reply(True)
        if status is None:
            wait_ended(self._process)
            reply = _reply(
                False, "ExitCode", "the shell exited; the context restarts on its next cell"
            )
        elif status == 130:
            reply = _reply(False, "KeyboardInterrupt", "interrupted", interrupted=True)
        elif status != 0:
            reply = _reply(False, "ExitCode", f"exit status {status}")
        return with_output(reply, streams, started, cpu_seconds(self._process.pid) - cpu)

    def _collect(self, sink: Sink | None) -> "tuple[list[tuple[bytes, int]], int | None]":
        """Both streams up to their markers; the cell's status, or None if bash ended."""
        assert self._process.stdout is not None
        assert self._process.stderr is not None
        fds = (self._process.stdout.fileno(), self._process.stderr.fileno())
        streams, trailer = collect(fds, self._token, self._limit, sink)
        if trailer is None:
            return streams, None
        return streams, int(trailer) if trailer.isdigit() else 0

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def _reply(
    success: bool,
    error_type: str | None = None,
    error_message: str | None = None,
    *,
    interrupted: bool = False,
) -> "dict[str, Any]":
    return {
        "success": success,
        "result_repr": None,
        "results": [],
        "error_type": error_type,
        "error_message": error_message,
        "traceback": None,
        "violations": [],
        "peak_memory_mb": 0.0,
        "truncated": False,
        "interrupted": interrupted,
    }


if __name__ == "__main__":
    os._exit(run(BashAdapter))
