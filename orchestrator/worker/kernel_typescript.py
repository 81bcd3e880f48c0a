"""The TypeScript kernel: the JavaScript kernel (kernel_node.py) with Debian's TypeScript
compiler (``node-typescript``) in front of each cell.

Each cell is transpiled on its own (``ts.transpileModule``: types stripped, no type check, as
``tsc --isolatedModules`` does) to the JavaScript node then runs in the kernel's one context,
so bindings, functions, top-level ``await``, ``import`` lines, the last value as the result, a
cell's env, errors with their stack and the SIGINT handling are the JavaScript kernel's. A cell
that does not parse as TypeScript fails with ``SyntaxError`` and the compiler's message. The
compiler is loaded once, at start (a second or so), from node's own module paths or where
Debian installs it.
"""

import os
import subprocess
import sys

if __name__ == "__main__" and not __package__:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

from .config import WorkerConfig
from .kernel import run
from .kernel_node import DRIVER, NODE, NodeAdapter

# Where Debian's node-typescript puts the compiler (node from other sources may not look there).
TYPESCRIPT_PATHS = ("typescript", "/usr/share/nodejs/typescript", "/usr/lib/nodejs/typescript")
# Run after the driver's own code and before its first cell: the compiler as its transform.
COMPILER = r"""
const ts = (() => {
  for (const where of %(paths)s) {
    try { return require(where); } catch (error) { /* the next place */ }
  }
  throw new Error("no TypeScript compiler: install Debian's node-typescript");
})();
transform = (source) => {
  const compiled = ts.transpileModule(withRequires(source), {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext,
                       removeComments: false },
    reportDiagnostics: true,
    fileName: FILENAME,
  });
  const problems = compiled.diagnostics || [];
  if (problems.length > 0) {
    const error = new SyntaxError(
      problems.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')).join('\n'));
    error.stack = error.name + ': ' + error.message;
    throw error;
  }
  return compiled.outputText.replace(/^export \{\};\s*$/m, '');
};
"""


_PATHS_JS = repr(list(TYPESCRIPT_PATHS)).replace("'", '"')


class TypeScriptAdapter(NodeAdapter):
    DRIVER = DRIVER + COMPILER % {"paths": _PATHS_JS}
    FILENAME = "cell.ts"

    def __init__(self, config: WorkerConfig) -> None:
        # Without the compiler the kernel does not start (the host says the language's
        # kernel could not start), rather than fail on every cell.
        self._compiler = _compiler_version()
        if not self._compiler:
            raise FileNotFoundError("no TypeScript compiler (Debian's node-typescript) for node")
        super().__init__(config)

    def _version(self) -> str:
        return f"typescript {self._compiler} ({super()._version()})"


def _compiler_version() -> str:
    """The compiler's version where node finds it, else empty."""
    # Its package.json only: loading the compiler itself takes a second or more.
    script = f"for (const p of {_PATHS_JS}) {{ try {{ console.log(require(p + '/package.json')"
    script += ".version); break }"
    script += " catch (e) {} }"
    try:
        found = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return found.stdout.strip()[:32]


if __name__ == "__main__":
    os._exit(run(TypeScriptAdapter))
