"""The REPL worker: a long-lived process inside the sandbox that runs Python cells for the host.

Started as ``python3 -I /opt/sandhold/worker/repl_worker.py`` (uid 10001, cwd /workspace) with the
protocol on stdin/stdout and its settings in ``SANDHOLD_WORKER_CONFIG``. At start the protocol moves
to private, non-inheritable fds; fd 0 becomes /dev/null and fd 1/2 point at /dev/null except
while a request runs, when they are that request's capture pipes. Then it writes
``{"type": "ready", "pid", "protocol", "python"}`` and answers each request line with exactly one
reply line (see wire.py for the format, ``Worker.handle`` for the operations). EOF on the
protocol input or a ``shutdown`` request ends it with status 0; a bad configuration with a
``{"type": "fatal"}`` line and status 2.

With ``persist`` set, the end of the host's stream does not end the worker: the host that started
it is gone (``kill -9`` of the orchestrator closes the attached exec), and the next one may want
the state back. The worker then serves connections on a unix socket at ``socket_path(pid)``, one
at a time, each opening with a fresh ready frame; ``relay.py`` joins such a connection to a new
exec's stream. Only a ``shutdown`` request, or a SIGKILL, ends a persistent worker.
"""

import codecs
import contextlib
import os
import socket
import sys
from collections.abc import Iterator

if __name__ == "__main__" and not __package__:
    # Run as a script: -I left this folder off sys.path. Import the folder as a package (named
    # after it) so the sibling modules' relative imports work the same here and on the host.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

from .capture import CapturedOutput, OutputCapture
from .cell_rules import dedent_cell, install_ipython_display
from .config import CONFIG_ENV, ConfigError, WorkerConfig, parse_config
from .display import CellResults
from .executor import CellOutcome, Executor
from .interrupts import InterruptGate
from .introspect import inspect_value, list_variables
from .lease import HostLease
from .metrics import ResourceMeter
from .preload import preload
from .relay import socket_path
from .wire import BadRequest, LineReader, Request, dump, encode_reply, parse_request, write_line

PROTOCOL_VERSION = 1
# A JSON-escaped character takes at most 6 bytes per byte of UTF-8 code, plus the envelope.
_ESCAPE_FACTOR = 6
_ENVELOPE_BYTES = 1 << 16
Reply = dict[str, object]


class Worker:
    """Reads requests, runs them, writes replies."""

    def __init__(self, config: WorkerConfig, protocol_in: int, protocol_out: int) -> None:
        self.config = config
        self.gate = InterruptGate()
        self.executor = Executor(config, self.gate)
        self.capture = OutputCapture(config.max_stream_bytes)
        self.meter = ResourceMeter()
        self._line_limit = config.max_code_bytes * _ESCAPE_FACTOR + _ENVELOPE_BYTES
        self._reader = LineReader(protocol_in, self._line_limit)
        self._out = protocol_out

    def serve(self, listener: socket.socket | None = None) -> int:
        """Serve the host's stream; then, with a ``listener``, one relay connection after
        another. Returns when a ``shutdown`` request is answered or the last stream ends."""
        lease = HostLease()
        while True:
            lease.hold()
            try:
                if self._serve_stream():
                    return 0
            except OSError:
                pass  # the peer went away while we wrote; a persistent worker waits for the next
            finally:
                lease.release()
                self._reader.close()
                if self._out != self._reader.fd:
                    os.close(self._out)
            if listener is None:
                return 0
            connection, _ = listener.accept()
            fd = connection.detach()
            self._reader = LineReader(fd, self._line_limit)
            self._out = fd

    def _serve_stream(self) -> bool:
        """One stream from ready frame to its end; True if it ended with ``shutdown``."""
        version = ".".join(str(part) for part in sys.version_info[:3])
        self._send(
            {"type": "ready", "pid": os.getpid(), "protocol": PROTOCOL_VERSION, "python": version}
        )
        while True:
            try:
                line = self._reader.read_line()
            except BadRequest as exc:
                self._send(_refusal(exc))
                continue
            if line is None:
                return False
            if not line.strip():
                continue
            reply, stop = self.handle(line)
            self._send(reply)
            if stop:
                return True

    def handle(self, line: bytes) -> tuple[Reply, bool]:
        """One request line to its reply, and whether the worker should stop after it."""
        try:
            request = parse_request(line)
        except BadRequest as exc:
            return _refusal(exc), False
        try:
            fields = self._dispatch(request)
        except BaseException as exc:  # a bug of ours or a user hook: still exactly one reply
            fields = {"ok": False, "error_type": "internal", "error_message": repr(exc)[:2000]}
        return {"type": "reply", "id": request.id, "ok": True, **fields}, request.op == "shutdown"

    def _dispatch(self, request: Request) -> Reply:
        if request.op == "execute":
            args = request.args
            sink = StreamSink(self._out, request.id) if args.get("stream") else None
            with request_env(args.get("env")):
                return self._execute(args["code"], sink)
        if request.op == "list_variables":
            return list_variables(self.executor.namespace)
        if request.op == "inspect":
            namespace, limit = self.executor.namespace, self.config.max_repr_chars
            return inspect_value(namespace, request.args["name"], limit, self.gate)
        if request.op == "reset":
            self.executor.reset()
            return {}
        if request.op == "ping":
            return {"pong": True}
        if request.op == "set_env":
            # The session's env, for every cell and child from now on (the host checked it).
            os.environ.update(request.args["env"])
            return {}
        if request.op == "preload":
            return preload(request.args["modules"], self.executor.restrictions)
        return {}  # shutdown: the reply is all there is to it

    def _execute(self, code: str, sink: "StreamSink | None" = None) -> Reply:
        self.gate.install()
        self.meter.start()
        compiled = self.executor.compile(dedent_cell(code))
        captured = CapturedOutput(b"", b"", False)
        results = CellResults(self.config.max_result_bytes, self.config.max_repr_chars)
        if isinstance(compiled, CellOutcome):
            outcome = compiled
        else:
            self.capture.start(sink)
            try:
                outcome = self.executor.run(compiled, results)
            finally:
                captured = self.capture.finish()
                if sink is not None:
                    sink.close()
        usage = self.meter.stop()
        return {
            "success": outcome.success,
            "stdout": _text(captured.stdout, self.config.max_stream_bytes),
            "stderr": _text(captured.stderr, self.config.max_stream_bytes),
            "stdout_bytes": captured.stdout_bytes,
            "stderr_bytes": captured.stderr_bytes,
            "result_repr": outcome.result_repr,
            "results": results.bundles,
            "results_dropped": results.dropped,
            "error_type": outcome.error_type,
            "error_message": outcome.error_message,
            "traceback": outcome.traceback,
            "violations": outcome.violations,
            "execution_time_ms": usage.execution_time_ms,
            "cpu_time_ms": usage.cpu_time_ms,
            "peak_memory_mb": usage.peak_memory_mb,
            "truncated": captured.truncated or results.truncated,
            "interrupted": outcome.interrupted,
        }

    def _send(self, message: Reply) -> None:
        try:
            line = encode_reply(message, self.config.max_reply_bytes)
        except (MemoryError, RecursionError, TypeError, ValueError) as exc:
            line = dump(
                {
                    "type": "reply",
                    "id": message.get("id"),
                    "ok": False,
                    "error_type": "internal",
                    "error_message": f"reply could not be encoded: {type(exc).__name__}",
                }
            )
        write_line(self._out, line)


class StreamSink:
    """A streaming request's output as ``{"type": "stream", "id", "name", "text"}`` frames on
    the protocol, before its reply. Fed by the capture (its lock held), so frames never mix
    with each other or with the reply; text is decoded incrementally, so a character split
    across two reads arrives whole."""

    _NAMES = ("stdout", "stderr")

    def __init__(self, out: int, request_id: str) -> None:
        self._out = out
        self._id = request_id
        self._decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in self._NAMES]
        self.broken = False

    def __call__(self, stream: int, data: bytes) -> None:
        self._send(stream, self._decoders[stream].decode(data))

    def close(self) -> None:
        for stream, decoder in enumerate(self._decoders):
            self._send(stream, decoder.decode(b"", final=True))

    def _send(self, stream: int, text: str) -> None:
        if not text or self.broken:
            return
        frame = {"type": "stream", "id": self._id, "name": self._NAMES[stream], "text": text}
        try:
            write_line(self._out, dump(frame))
        except BaseException:  # the host is gone: the reply's write will find out too
            self.broken = True


@contextlib.contextmanager
def request_env(env: "dict[str, str] | None") -> Iterator[None]:
    """``env`` in os.environ (so child processes see it) for one request, then as it was."""
    if not env:
        yield
        return
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _refusal(exc: BadRequest) -> Reply:
    return {
        "type": "reply",
        "id": exc.request_id,
        "ok": False,
        "error_type": "invalid_argument",
        "error_message": str(exc),
    }


def _text(data: bytes, limit: int) -> str:
    """Captured bytes as text of at most ``limit`` UTF-8 bytes (U+FFFD for undecodable ones)."""
    text = data.decode("utf-8", errors="replace")
    if len(text) * 3 > limit:
        while len(text.encode("utf-8")) > limit:
            text = text[: len(text) - max(1, (len(text.encode("utf-8")) - limit) // 3)]
    return text


def _take_protocol_fds() -> tuple[int, int]:
    """Move the protocol to private fds; fd 0/1/2 become /dev/null."""
    protocol_in, protocol_out = os.dup(0), os.dup(1)  # os.dup: non-inheritable
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    # Line buffering keeps print() and os.write(1, ...) in order; UTF-8 whatever the locale.
    for stream, line_buffering in ((sys.stdout, True), (sys.stderr, False)):
        stream.reconfigure(  # type: ignore[union-attr]
            encoding="utf-8", errors="backslashreplace", line_buffering=line_buffering
        )
    return protocol_in, protocol_out


def _listen() -> socket.socket | None:
    """The socket a relay reaches this worker on, bound before any user code runs; None if it
    cannot be made (the worker then ends with the host's stream, as without ``persist``)."""
    path = socket_path(os.getpid())
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # a worker that had this pid before is gone
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
    except OSError:
        return None
    return listener


def _add_user_site() -> None:
    """An unrestricted session imports what ``pip install`` put in the user's site-packages
    (``~/.local``: the image's own are read-only), which ``-I`` left off ``sys.path``. Made
    now if missing, so that a package installed later imports without a restart; last on the
    path, so nothing installed there shadows the standard library or the image's packages."""
    import site

    path = site.getusersitepackages()
    with contextlib.suppress(OSError):
        os.makedirs(path, exist_ok=True)
    if os.path.isdir(path) and path not in sys.path:
        site.addsitedir(path)


def main() -> int:
    try:
        config = parse_config(os.environ.pop(CONFIG_ENV, None))
    except ConfigError as exc:
        write_line(1, dump({"type": "fatal", "error_message": str(exc)}))
        return 2
    listener = _listen() if config.persist else None
    protocol_in, protocol_out = _take_protocol_fds()
    worker = Worker(config, protocol_in, protocol_out)
    worker.gate.install()
    if worker.executor.restrictions is not None:
        worker.executor.restrictions.install_process_guards()
    else:
        _add_user_site()
        install_ipython_display(worker.executor.display.display)
    # The session's namespace is __main__ from now on: pickling, dataclasses and typing resolve
    # user classes there, and the worker's own globals are no longer reachable by that name.
    sys.modules["__main__"] = worker.executor.module
    return worker.serve(listener)


if __name__ == "__main__":
    os._exit(main())
