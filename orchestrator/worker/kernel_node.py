"""The JavaScript kernel: one long-lived ``node`` whose globals, ``let``/``const`` bindings and
functions last from cell to cell, behind the worker protocol (kernel.py).

The node side is the short driver below, written to the kernel's own folder at start: it reads
cells as JSON lines on fd 3 (so a cell reading stdin never sees them), runs each with ``vm`` in
one context that lives as long as the kernel (top-level bindings of one script are seen by the
next, as in a browser's console), awaits a cell's promise, and after it prints the marker:
a random token, then the outcome as JSON (the value's ``util.inspect``, a string's text for its
bundle, or the error's name, message and stack). A cell with a top-level ``await`` that does
not compile as a script runs in an async function (a top-level ``const``/``let`` becoming a
global), its last expression the value. A static ``import`` line becomes the ``require`` it
stands for (a cell is a script, not a module), so ``import { readFileSync } from 'fs'`` works
in a cell. A cell's env is in ``process.env`` for that cell only.

SIGINT (the host's timeout) goes to node, whose driver ends the running cell at once with a
``KeyboardInterrupt`` (the state kept; a promise the cell left pending runs on); a cell busy in
a loop of its own holds node until the host's kill grace, then the kernel is killed and
replaced (``state_reset``). node dies with the kernel (PR_SET_PDEATHSIG).
"""

import contextlib
import ctypes
import json
import os
import secrets
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

from .config import WorkerConfig
from .kernel import Sink, run
from .kernel_pipes import collect, cpu_seconds, wait_ended, with_output

NODE = "node"
# Cells reach the driver on this fd, a pipe of the kernel's own.
CELL_FD = 3
_PR_SET_PDEATHSIG = 1
DRIVER = r"""
'use strict';
const fs = require('fs');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const context = vm.createContext(Object.assign(Object.create(globalThis), {
  require, module, exports: module.exports, console, process, Buffer, URL, URLSearchParams,
  TextEncoder, TextDecoder, setTimeout, clearTimeout, setInterval, clearInterval, setImmediate,
  clearImmediate, queueMicrotask, structuredClone, fetch: globalThis.fetch,
}));
const INTERRUPTED = { name: 'KeyboardInterrupt', message: 'interrupted', stack: '' };
let finish = null;
process.on('SIGINT', () => {
  if (finish) finish({ error: INTERRUPTED, interrupted: true });
});
// A cell as the script node runs (the TypeScript kernel puts its compiler here).
let transform = (code) => withRequires(code);
const FILENAME = process.argv[2] || 'cell.js';
// A static `import` at the start of a line, as the `require` a script can run (a cell is a
// script, not a module): default, namespace, named (with `as`) and bare imports.
const IMPORT = new RegExp('^([ \\t]*)import\\s+(?:([\\w$]+)\\s*,?\\s*)?' +
  '(?:\\*\\s+as\\s+([\\w$]+)|\\{([^}]*)\\})?\\s*(?:from\\s*)?' +
  '([\'"][^\'"\\n]+[\'"])[ \\t]*;?', 'gm');
function withRequires(code) {
  return code.replace(IMPORT, (whole, indent, name, space, names, from) => {
    const parts = [];
    const source = 'require(' + from + ')';
    if (name) parts.push(`${name} = ((m) => m && m.__esModule ? m.default : m)(${source})`);
    if (space) parts.push(`${space} = ${source}`);
    if (names !== undefined) {
      const fields = names.split(',').map((n) => n.trim()).filter(Boolean)
        .map((n) => n.replace(/\s+as\s+/, ': '));
      parts.push(`{ ${fields.join(', ')} } = ${source}`);
    }
    return indent + (parts.length ? 'var ' + parts.join(', ') + ';' : source + ';');
  });
}
// A cell indented as a whole (pasted from inside a block) runs as if it were not, so that its
// last line can be its value.
function dedent(code) {
  const lines = code.split('\n');
  const indents = lines.filter((line) => line.trim()).map((line) => /^[ \t]*/.exec(line)[0]);
  if (indents.length === 0) return code;
  let common = indents[0];
  for (const indent of indents) {
    while (!indent.startsWith(common)) common = common.slice(0, -1);
  }
  return common ? lines.map((line) => line.slice(common.length)).join('\n') : code;
}
async function evaluate(source) {
  const options = { filename: FILENAME };
  const code = transform(dedent(source));
  let value;
  try {
    value = vm.runInContext(code, context, options);
  } catch (error) {
    if (!(error && error.name === 'SyntaxError' && /\bawait\b/.test(code))) throw error;
    value = await vm.runInContext(asAsync(code), context, options);
  }
  if (value && typeof value.then === 'function') value = await value;
  return value;
}
// A cell with a top-level await, as an async function's body: a top-level `const x =` (or let,
// var) becomes a global `x =` so later cells see it, and a last line that is an expression is
// returned as the cell's value.
const STATEMENT = /^(const|let|var|function|class|if|for|while|do|switch|try|return|throw|[}\/])/;
function asAsync(code) {
  const binding = /(^|;\s*)(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=/g;
  const lines = code.split('\n').map((line) => line.replace(binding, '$1$2 ='));
  for (let at = lines.length - 1; at >= 0; at--) {
    const body = lines[at].trim().replace(/;\s*$/, '');
    if (!body) continue;
    const cut = body.lastIndexOf(';');
    const last = body.slice(cut + 1).trim();
    if (!STATEMENT.test(last) && !lines[at].startsWith(' ') && !last.endsWith('{')) {
      lines[at] = body.slice(0, cut + 1) + ' return (' + last + ');';
    }
    break;
  }
  return '(async () => {\n' + lines.join('\n') + '\n})()';
}
function describe(error) {
  if (error && typeof error === 'object' && 'stack' in error) {
    const name = String(error.name || 'Error');
    return { name, message: String(error.message), stack: String(error.stack || '') };
  }
  return { name: 'Error', message: util.inspect(error), stack: '' };
}
function setEnv(values) {
  const saved = {};
  for (const [name, value] of Object.entries(values)) {
    saved[name] = process.env[name];
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
  return saved;
}
async function runCell(request) {
  const saved = setEnv(request.env || {});
  const outcome = await new Promise((resolve) => {
    finish = resolve;
    evaluate(request.code).then(
      (value) => resolve(value === undefined ? {} : typeof value === 'string'
        ? { value: util.inspect(value), text: value } : { value: util.inspect(value) }),
      (error) => resolve({ error: describe(error) }));
  });
  finish = null;
  setEnv(saved);
  return outcome;
}
function write(stream, text) {
  return new Promise((resolve) => stream.write(text, resolve));
}
(async () => {
  const lines = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }) });
  for await (const line of lines) {
    const request = JSON.parse(line);
    const outcome = await runCell(request);
    await write(process.stdout, request.token + JSON.stringify(outcome) + '\n');
    await write(process.stderr, request.token + '\n');
  }
  process.exit(0);
})();
"""


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class NodeAdapter:
    # The TypeScript kernel's driver is this one with its compiler in front of each cell.
    DRIVER = DRIVER
    FILENAME = "cell.js"

    def __init__(self, config: WorkerConfig) -> None:
        self._limit = config.max_stream_bytes
        self._dir = tempfile.mkdtemp(prefix="sandhold-node-")
        driver = os.path.join(self._dir, "driver.js")
        with open(driver, "w", encoding="utf-8") as file:
            file.write(self.DRIVER)
        self._token = secrets.token_hex(16).encode()
        cells_out, self._cells = os.pipe()

        def in_child() -> None:
            os.dup2(cells_out, CELL_FD)
            _die_with_parent()

        self._process = subprocess.Popen(
            [NODE, driver, self.FILENAME],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(CELL_FD,),
            start_new_session=True,
            preexec_fn=in_child,
        )
        os.close(cells_out)
        self.version = self._version()
        self._running = False
        self._env: dict[str, str] = {}

    def _version(self) -> str:
        found = subprocess.run([NODE, "--version"], capture_output=True, text=True, check=False)
        return "node " + found.stdout.strip()[:48]

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
        request = {"code": code, "env": {**self._env, **env}, "token": self._token.decode()}
        self._running = True
        try:
            os.write(self._cells, json.dumps(request).encode() + b"\n")
            streams, trailer = self._collect(sink)
        except OSError:
            streams, trailer = self._collect(sink)
        finally:
            self._running = False
        if trailer is None:
            wait_ended(self._process)
        reply = _reply(trailer)
        return with_output(reply, streams, started, cpu_seconds(self._process.pid) - cpu)

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


def _reply(trailer: bytes | None) -> "dict[str, Any]":
    """The reply's fields from the driver's outcome (None: node ended before it)."""
    reply: dict[str, Any] = {
        "success": True,
        "result_repr": None,
        "results": [],
        "error_type": None,
        "error_message": None,
        "traceback": None,
        "violations": [],
        "peak_memory_mb": 0.0,
        "truncated": False,
        "interrupted": False,
    }
    if trailer is None:
        return reply | {
            "success": False,
            "error_type": "ExitCode",
            "error_message": "node exited; the context restarts on its next cell",
        }
    try:
        outcome = json.loads(trailer)
    except ValueError:
        outcome = {"error": {"name": "Error", "message": "the driver's outcome is unreadable"}}
    error = outcome.get("error") if isinstance(outcome, dict) else None
    if isinstance(error, dict):
        return reply | {
            "success": False,
            "error_type": str(error.get("name") or "Error")[:128],
            "error_message": str(error.get("message") or ""),
            "traceback": str(error.get("stack") or "") or None,
            "interrupted": bool(outcome.get("interrupted")),
        }
    value = outcome.get("value") if isinstance(outcome, dict) else None
    if isinstance(value, str):
        # A string's bundle is its text, as notebooks' JavaScript kernels show it; its repr
        # is quoted, as util.inspect (and Python's repr) has it.
        text = outcome.get("text")
        reply["result_repr"] = value
        shown = text if isinstance(text, str) else value
        reply["results"] = [{"text/plain": shown, "is_main_result": True}]
    return reply


if __name__ == "__main__":
    os._exit(run(NodeAdapter))
