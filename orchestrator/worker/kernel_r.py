"""The R kernel: one long-lived ``R`` whose global environment (variables, functions, loaded
packages) lasts from cell to cell, behind the worker protocol (kernel.py).

The R side is the short driver below, written to the kernel's own folder at start. For each
cell the kernel writes the code and the cell's env (as R's own string literals) to files of
that folder, then a line on fd 3 (a pipe of the kernel's own, so a cell reading stdin never
sees it). The driver parses the cell and evaluates its expressions in the global environment,
as R's console does: a visible value before the last is printed, the last one's printed form
is the cell's result (``[1] "text"``, as IRkernel shows it). A graphics device the cell opened
is closed after it and each page it drew is a PNG result. After the cell the driver writes its
outcome (error class, message and the calls that led to it) to files of the folder and prints
the marker (kernel_pipes.py) on stdout and stderr; the trailer says ``ok``, ``error`` or
``interrupted``.

A cell's env is set with ``Sys.setenv`` before it and put back after it. SIGINT (the host's
timeout) interrupts R, which ends the cell with an ``interrupt`` condition (the state kept);
R busy in compiled code holds until the host's kill grace, then the kernel is killed and
replaced (``state_reset``). R dies with the kernel (PR_SET_PDEATHSIG).
"""

import os
import sys

if __name__ == "__main__" and not __package__:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

from .kernel import run
from .kernel_driver import DriverAdapter, run_version

R_ARGV = ("R", "--vanilla", "--quiet", "--no-echo", "--no-readline")
DRIVER = r"""
local({
  args <- commandArgs(trailingOnly = TRUE)
  token <- args[[1]]
  folder <- args[[2]]
  path <- function(name) file.path(folder, name)
  requests <- file("/proc/self/fd/3", open = "r")
  options(warn = 1, device = function(...) {
    grDevices::png(path("plot-%03d.png"), width = 672, height = 480,
                   type = if (capabilities("cairo")) "cairo" else "Xlib")
  })
  write_field <- function(name, text) {
    writeLines(enc2utf8(paste(text, collapse = "\n")), path(name), useBytes = TRUE)
  }
  run_cell <- function() {
    env <- eval(parse(path("env"), keep.source = FALSE, encoding = "UTF-8"))
    saved <- Sys.getenv(names(env), unset = NA, names = TRUE)
    if (length(env) > 0) do.call(Sys.setenv, as.list(env))
    on.exit({
      for (name in names(saved)) {
        if (is.na(saved[[name]])) Sys.unsetenv(name) else do.call(Sys.setenv, as.list(saved[name]))
      }
      while (grDevices::dev.cur() > 1) grDevices::dev.off()
    })
    exprs <- tryCatch(
      parse(text = readLines(path("cell.R"), encoding = "UTF-8", warn = FALSE),
            keep.source = FALSE, srcfile = "cell"),
      error = function(e) e)
    if (inherits(exprs, "error")) {
      write_field("error_type", "SyntaxError")
      write_field("error_message", conditionMessage(exprs))
      write_field("traceback", paste0("Error: ", conditionMessage(exprs)))
      return("error")
    }
    calls <- NULL
    status <- tryCatch(withCallingHandlers({
      count <- length(exprs)
      for (i in seq_len(count)) {
        shown <- withVisible(eval(exprs[[i]], envir = globalenv()))
        if (shown$visible) {
          if (i < count) print(shown$value)
          else write_field("value", utils::capture.output(print(shown$value)))
        }
      }
      "ok"
    }, error = function(e) {
      calls <<- sys.calls()
    }), error = function(e) {
      write_field("error_type", class(e)[[1]])
      write_field("error_message", conditionMessage(e))
      # The cell's own calls: those after the driver's eval (two frames) and before the
      # condition's handlers (two frames).
      lines <- vapply(calls, function(call) paste(deparse(call, nlines = 1), collapse = ""), "")
      at <- which(startsWith(lines, "eval(exprs[[i]]"))
      if (length(at) > 0) lines <- lines[-seq_len(max(at[at <= at[[1]] + 1]))]
      lines <- head(lines, -2)
      write_field("traceback", c(lines, paste0("Error: ", conditionMessage(e))))
      "error"
    }, interrupt = function(e) "interrupted")
    status
  }
  mark <- function(status) {
    cat(token, status, "\n", sep = "")
    cat(token, "\n", sep = "", file = stderr())
    flush(stdout())
    flush(stderr())
  }
  mark("ready")
  repeat {
    line <- readLines(requests, n = 1)
    if (length(line) == 0) break
    mark(run_cell())
  }
  quit(save = "no", status = 0)
})
"""


def r_string(value: str) -> str:
    """``value`` as an R string literal (UTF-8, every character that needs it escaped)."""
    out = []
    for char in value:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\U{{{ord(char):x}}}" if ord(char) else "")
    return '"' + "".join(out) + '"'


class RAdapter(DriverAdapter):
    LANGUAGE = "R"
    DRIVER_NAME = "driver.R"
    DRIVER = DRIVER
    CELL_NAME = "cell.R"

    def argv(self, driver: str, token: str, folder: str) -> "list[str]":
        return [*R_ARGV, "-f", driver, "--args", token, folder]

    def env_file(self, env: "dict[str, str]") -> str:
        pairs = ", ".join(f"{r_string(n)} = {r_string(v)}" for n, v in env.items())
        return f"c({pairs})\n" if pairs else "character(0)\n"

    def find_version(self) -> str:
        return run_version(["R", "--version"])


if __name__ == "__main__":
    os._exit(run(RAdapter))
