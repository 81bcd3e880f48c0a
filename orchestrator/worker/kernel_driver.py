"""What the R and the Java kernel (kernel_r.py, kernel_java.py) share: a language process
running a driver of the kernel's own, told to run a cell by a line on fd 3 (a pipe of the
kernel's own, so a cell reading stdin never sees it), with the cell, its env and its outcome
in files of the kernel's private folder (no JSON parser needed on the language's side).

The driver prints the marker (kernel_pipes.py) once when it is ready, and after every cell;
the trailer says ``ok``, ``error`` or ``interrupted``. What the process printed while it
started (a JVM's notes, R's) is dropped with the ready marker, before the first cell runs. The
outcome files are ``value`` (the last value's text), ``error_type``, ``error_message``,
``traceback``, and ``plot-*.png`` (rich results). SIGINT (the host's timeout) goes to the
process only; the process dies with the kernel (PR_SET_PDEATHSIG).
"""

import base64
import contextlib
import ctypes
import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

from .config import WorkerConfig
from .kernel import Sink
from .kernel_pipes import collect, cpu_seconds, wait_ended, with_output

CELL_FD = 3
_PR_SET_PDEATHSIG = 1
# At most this many images of one cell become results (a loop drawing thousands must not fill
# the reply).
MAX_IMAGES = 16
OUTCOME_FILES = ("value", "error_type", "error_message", "traceback")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class DriverAdapter:
    """A language process driven through files; subclasses give the driver and its argv."""

    LANGUAGE = ""
    DRIVER_NAME = ""
    DRIVER = ""
    CELL_NAME = "cell"

    def argv(self, driver: str, token: str, folder: str) -> "list[str]":
        raise NotImplementedError

    def env_file(self, env: "dict[str, str]") -> str:
        """The cell's env as the driver reads it."""
        raise NotImplementedError

    def find_version(self) -> str:
        raise NotImplementedError

    def __init__(self, config: WorkerConfig) -> None:
        self._limit = config.max_stream_bytes
        self._dir = tempfile.mkdtemp(prefix=f"sandhold-{self.LANGUAGE.lower()}-")
        driver = os.path.join(self._dir, self.DRIVER_NAME)
        with open(driver, "w", encoding="utf-8") as file:
            file.write(self.DRIVER)
        self._token = secrets.token_hex(16).encode()
        cells_out, self._cells = os.pipe()

        def in_child() -> None:
            os.dup2(cells_out, CELL_FD)
            _die_with_parent()

        self._process = subprocess.Popen(
            self.argv(driver, self._token.decode(), self._dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(CELL_FD,),
            start_new_session=True,
            preexec_fn=in_child,
        )
        os.close(cells_out)
        self.version = self.find_version()
        self._started = False
        self._running = False
        self._env: dict[str, str] = {}

    def alive(self) -> bool:
        return self._process.poll() is None

    def set_env(self, env: "dict[str, str]") -> None:
        self._env.update(env)  # given with every cell after this one

    def interrupt(self) -> None:
        if self._running:
            with contextlib.suppress(OSError):
                os.kill(self._process.pid, signal.SIGINT)

    def execute(self, code: str, env: "dict[str, str]", sink: Sink | None) -> "dict[str, Any]":
        started, cpu = time.perf_counter(), cpu_seconds(self._process.pid)
        merged = {**self._env, **env}
        bad = [name for name in merged if not name or "=" in name or "\0" in name]
        if bad or any("\0" in value for value in merged.values()):
            shown = bad[0][:64] if bad else "a value with a NUL"
            reply = reply_fields(False, "validation", f"not an env entry: {shown!r}")
            return with_output(reply, [(b"", 0), (b"", 0)], started, 0.0)
        self._running = True
        try:
            trailer: bytes | None = b""
            if not self._started:
                # Startup's output is not the cell's; a process that died starting says so.
                _, trailer = self._collect(None)
                self._started = True
            if trailer is not None:
                self._write(self.CELL_NAME, code)
                self._write("env", self.env_file(merged))
                os.write(self._cells, b"run\n")
                streams, trailer = self._collect(sink)
            else:
                streams = [(b"", 0), (b"", 0)]
        except OSError:
            streams, trailer = self._collect(sink)
        finally:
            self._running = False
        if trailer is None:
            wait_ended(self._process)
            reply = reply_fields(
                False,
                "ExitCode",
                f"{self.LANGUAGE} exited; the context restarts on its next cell",
                traceback=self._stderr_tail(streams),
            )
        elif trailer == b"interrupted":
            reply = reply_fields(False, "KeyboardInterrupt", "interrupted", interrupted=True)
        else:
            reply = self._outcome(trailer == b"ok")
        return with_output(reply, streams, started, cpu_seconds(self._process.pid) - cpu)

    @staticmethod
    def _stderr_tail(streams: "list[tuple[bytes, int]]") -> str | None:
        tail = streams[1][0][-2000:].decode("utf-8", "replace").strip()
        return tail or None

    def _write(self, name: str, text: str) -> None:
        path = os.path.join(self._dir, name)
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as file:
            file.write(text)

    def _read(self, name: str) -> str | None:
        try:
            with open(os.path.join(self._dir, name), encoding="utf-8", errors="replace") as f:
                return f.read().removesuffix("\n")
        except OSError:
            return None

    def _outcome(self, success: bool) -> "dict[str, Any]":
        """The reply from the files the driver wrote: the error, or the value and images."""
        fields = {name: self._read(name) for name in OUTCOME_FILES}
        for name in OUTCOME_FILES:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._dir, name))
        images = sorted(glob.glob(os.path.join(self._dir, "plot-*.png")))
        if not success:
            reply = reply_fields(
                False,
                (fields["error_type"] or "Error")[:128],
                fields["error_message"] or "",
                traceback=fields["traceback"],
            )
        else:
            reply = reply_fields(True)
            if fields["value"] is not None:
                reply["result_repr"] = fields["value"]
                reply["results"].append({"text/plain": fields["value"], "is_main_result": True})
        for index, image in enumerate(images):
            if index < MAX_IMAGES:
                with open(image, "rb") as file:
                    data = base64.b64encode(file.read()).decode("ascii")
                # Every bundle has a text form (the host's protocol requires one).
                shown = f"<{self.LANGUAGE} plot {index + 1}>"
                reply["results"].append(
                    {"image/png": data, "text/plain": shown, "is_main_result": False}
                )
            os.unlink(image)
        return reply

    def _collect(self, sink: Sink | None) -> "tuple[list[tuple[bytes, int]], bytes | None]":
        assert self._process.stdout is not None
        assert self._process.stderr is not None
        fds = (self._process.stdout.fileno(), self._process.stderr.fileno())
        return collect(fds, self._token, self._limit, sink)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        os.close(self._cells)
        shutil.rmtree(self._dir, ignore_errors=True)


def run_version(argv: "list[str]") -> str:
    """The first line a version command prints (on stdout or stderr), or ``(unknown)``."""
    try:
        found = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "(unknown)"
    lines = (found.stdout + found.stderr).strip().splitlines()
    return lines[0][:64] if lines else "(unknown)"


def reply_fields(
    success: bool,
    error_type: str | None = None,
    error_message: str | None = None,
    *,
    traceback: str | None = None,
    interrupted: bool = False,
) -> "dict[str, Any]":
    return {
        "success": success,
        "result_repr": None,
        "results": [],
        "error_type": error_type,
        "error_message": error_message,
        "traceback": traceback,
        "violations": [],
        "peak_memory_mb": 0.0,
        "truncated": False,
        "interrupted": interrupted,
    }
