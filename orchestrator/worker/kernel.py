"""The protocol side of a language kernel: what a context of another language than Python runs
in place of ``repl_worker.py``, speaking the same protocol (wire.py) to the host.

A kernel is an adapter in front of the language's own long-lived process (``kernel_bash.py``
drives bash); this module reads the host's requests, hands ``execute`` to the adapter and
writes its one reply per request. The ready frame, the request schema, the reply size limit and
streamed output are the worker's own, so the host drives a kernel exactly as it drives the
Python worker: timeouts by SIGINT then SIGKILL, a dead kernel replaced with ``state_reset``.

Operations on Python state (``list_variables``, ``inspect``, ``preload``) are answered
``not_supported``; the host does not send them to a kernel. The end of the host's stream, a
``shutdown``, or the adapter's process ending (``exit`` in a bash cell) ends the kernel: the
host starts a fresh one on the next call and says the state was reset. Kernels never persist
across an orchestrator restart (the default Python context does).
"""

import codecs
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

from .config import CONFIG_ENV, ConfigError, WorkerConfig, parse_config
from .wire import BadRequest, LineReader, dump, encode_reply, parse_request, write_line

PROTOCOL_VERSION = 1
# As repl_worker: a JSON-escaped character takes at most 6 bytes per byte, plus the envelope.
_ESCAPE_FACTOR = 6
_ENVELOPE_BYTES = 1 << 16
# Streamed output: (0 for stdout or 1 for stderr, bytes).
Sink = Callable[[int, bytes], None]


class Adapter(Protocol):
    """A language's long-lived process, as a kernel drives it."""

    version: str

    def execute(self, code: str, env: "dict[str, str]", sink: Sink | None) -> "dict[str, Any]":
        """Run one cell; the reply's fields (those of repl_worker's ``_execute``)."""

    def interrupt(self) -> None:
        """Stop the cell being run (called from the SIGINT handler)."""

    def set_env(self, env: "dict[str, str]") -> None:
        """The session's env, for every cell from now on."""

    def alive(self) -> bool:
        """False once the language's process has ended: the kernel ends after its reply."""

    def close(self) -> None:
        """End the language's process."""


class StreamFrames:
    """A streaming request's output as stream frames (as repl_worker's ``StreamSink``)."""

    _NAMES = ("stdout", "stderr")

    def __init__(self, out: int, request_id: str) -> None:
        self._out = out
        self._id = request_id
        self._decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in self._NAMES]
        self.broken = False

    def __call__(self, stream: int, data: bytes) -> None:
        text = self._decoders[stream].decode(data)
        if not text or self.broken:
            return
        frame = {"type": "stream", "id": self._id, "name": self._NAMES[stream], "text": text}
        try:
            write_line(self._out, dump(frame))
        except OSError:
            self.broken = True


def serve(adapter: Adapter, config: WorkerConfig, protocol_in: int, protocol_out: int) -> int:
    """Answer the host's requests until its stream ends, a ``shutdown``, or the adapter dies."""
    limit = config.max_code_bytes * _ESCAPE_FACTOR + _ENVELOPE_BYTES
    reader = LineReader(protocol_in, limit)

    def send(message: "dict[str, Any]") -> None:
        write_line(protocol_out, encode_reply(message, config.max_reply_bytes))

    send(
        {
            "type": "ready",
            "pid": os.getpid(),
            "protocol": PROTOCOL_VERSION,
            "python": adapter.version,
        }
    )
    while True:
        try:
            line = reader.read_line()
        except BadRequest as exc:
            send(_refusal(exc.request_id, "invalid_argument", str(exc)))
            continue
        if line is None:
            return 0
        if not line.strip():
            continue
        try:
            request = parse_request(line)
        except BadRequest as exc:
            send(_refusal(exc.request_id, "invalid_argument", str(exc)))
            continue
        fields: dict[str, Any] = {}
        if request.op == "execute":
            sink = StreamFrames(protocol_out, request.id) if request.args.get("stream") else None
            fields = adapter.execute(request.args["code"], request.args.get("env") or {}, sink)
        elif request.op == "set_env":
            adapter.set_env(request.args["env"])
        elif request.op == "ping":
            fields = {"pong": True}
        elif request.op not in ("shutdown", "reset"):
            message = f"{request.op} is not supported by this language's context"
            send(_refusal(request.id, "not_supported", message))
            continue
        send({"type": "reply", "id": request.id, "ok": True, **fields})
        if request.op == "shutdown" or not adapter.alive():
            return 0


def _refusal(request_id: str | None, error_type: str, message: str) -> "dict[str, Any]":
    return {
        "type": "reply",
        "id": request_id,
        "ok": False,
        "error_type": error_type,
        "error_message": message,
    }


def take_protocol_fds() -> "tuple[int, int]":
    """The protocol on private, non-inheritable fds; fd 0/1/2 become /dev/null, so nothing the
    language's process inherits can write a frame."""
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return protocol_in, protocol_out


def run(make_adapter: "Callable[[WorkerConfig], Adapter]") -> int:
    """A kernel's ``main``: its settings, its adapter, SIGINT to the adapter, then ``serve``."""
    try:
        config = parse_config(os.environ.pop(CONFIG_ENV, None))
    except ConfigError as exc:
        write_line(1, dump({"type": "fatal", "error_message": str(exc)}))
        return 2
    protocol_in, protocol_out = take_protocol_fds()
    try:
        adapter = make_adapter(config)
    except OSError as exc:
        write_line(protocol_out, dump({"type": "fatal", "error_message": f"no kernel: {exc}"}))
        return 2
    signal.signal(signal.SIGINT, lambda signum, frame: adapter.interrupt())
    try:
        return serve(adapter, config, protocol_in, protocol_out)
    except OSError:
        return 0  # the host went away while we wrote
    finally:
        adapter.close()
