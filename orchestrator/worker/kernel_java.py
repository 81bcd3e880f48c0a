"""The Java kernel: one long-lived JVM running JShell (the JDK's ``jdk.jshell`` API, the engine
of the ``jshell`` tool) whose variables, methods, classes and imports last from cell to cell,
behind the worker protocol (kernel.py, kernel_driver.py).

The driver below is compiled and started by the JVM's source launcher (``java Driver.java``);
it runs JShell with its local execution engine, so a cell runs in the driver's own JVM and its
``System.out`` and ``System.err`` are the kernel's pipes. A cell is cut into snippets as jshell
cuts what is typed (``SourceCodeAnalysis``) and each is evaluated in turn: the last one's value,
if it is an expression with a value, is the result (a ``String`` as its text, as E2B's Java
kernel shows it, others as jshell prints them); a snippet that does not compile is the cell's
``CompilationError`` with javac's messages; an exception is the cell's error with its class,
message and stack.

Java cannot change its own process environment: a cell's env, and the kernel's (the
session's), are given as system properties (``System.getProperty("NAME")``, as E2B's Java
kernel gives them), a cell's put back after it. SIGINT (the host's timeout) stops the running
snippet (``JShell.stop``, the state kept); a cell that does not stop holds the JVM until the
host's kill grace, then the kernel is killed and replaced (``state_reset``).
"""

import os
import shutil
import sys

if __name__ == "__main__" and not __package__:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)

from .kernel import run
from .kernel_driver import DriverAdapter

# A small heap to start, a quick JIT and a serial collector: a JVM per context must be cheap.
JAVA_ARGV = (
    "java",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xss4m",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
DRIVER = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import jdk.jshell.*;

public class Driver {
    static volatile boolean interrupted = false;
    static volatile boolean running = false;

    public static void main(String[] args) throws Exception {
        String token = args[0];
        Path folder = Paths.get(args[1]);
        for (Map.Entry<String, String> entry : System.getenv().entrySet()) {
            if (System.getProperty(entry.getKey()) == null) {
                System.setProperty(entry.getKey(), entry.getValue());
            }
        }
        JShell shell = JShell.builder().executionEngine("local")
            .out(System.out).err(System.err).in(InputStream.nullInputStream()).build();
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), signal -> {
            if (running) { interrupted = true; shell.stop(); }
        });
        shell.eval("1");
        mark(token, "ready");
        BufferedReader requests = new BufferedReader(new InputStreamReader(
            new FileInputStream("/proc/self/fd/3"), StandardCharsets.UTF_8));
        while (requests.readLine() != null) {
            mark(token, runCell(shell, folder));
        }
        System.exit(0);
    }

    static void mark(String token, String status) {
        System.out.print(token + status + "\n");
        System.out.flush();
        System.err.print(token + "\n");
        System.err.flush();
    }

    static void write(Path folder, String name, String text) throws IOException {
        Files.write(folder.resolve(name), text.getBytes(StandardCharsets.UTF_8));
    }

    static String runCell(JShell shell, Path folder) throws IOException {
        String code = new String(Files.readAllBytes(folder.resolve("cell.java")),
                                 StandardCharsets.UTF_8);
        String[] env = new String(Files.readAllBytes(folder.resolve("env")),
                                  StandardCharsets.UTF_8).split("\0", -1);
        Map<String, String> saved = new HashMap<>();
        for (int i = 0; i + 1 < env.length; i += 2) {
            saved.put(env[i], System.getProperty(env[i]));
            System.setProperty(env[i], env[i + 1]);
        }
        interrupted = false;
        running = true;
        try {
            return evaluate(shell, folder, code);
        } finally {
            running = false;
            System.out.flush();
            System.err.flush();
            for (Map.Entry<String, String> entry : saved.entrySet()) {
                if (entry.getValue() == null) System.clearProperty(entry.getKey());
                else System.setProperty(entry.getKey(), entry.getValue());
            }
        }
    }

    static String evaluate(JShell shell, Path folder, String code) throws IOException {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String remaining = code;
        String value = null;
        while (!remaining.trim().isEmpty()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            SourceCodeAnalysis.Completeness completeness = info.completeness();
            if (completeness == SourceCodeAnalysis.Completeness.EMPTY) break;
            if (!completeness.isComplete()) {
                write(folder, "error_type", "CompilationError");
                write(folder, "error_message", "the cell ends in the middle of a statement");
                write(folder, "traceback", remaining.trim());
                return "error";
            }
            String source = info.source();
            remaining = info.remaining();
            value = null;
            for (SnippetEvent event : shell.eval(source)) {
                if (interrupted) return "interrupted";
                if (event.causeSnippet() != null) continue;
                Snippet snippet = event.snippet();
                if (event.status() == Snippet.Status.REJECTED) {
                    StringBuilder messages = new StringBuilder();
                    shell.diagnostics(snippet).forEach(d -> {
                        if (messages.length() > 0) messages.append("\n");
                        messages.append(d.getMessage(Locale.ROOT));
                    });
                    write(folder, "error_type", "CompilationError");
                    write(folder, "error_message", messages.toString());
                    write(folder, "traceback", source.trim() + "\n" + messages);
                    return "error";
                }
                JShellException thrown = event.exception();
                if (thrown != null) {
                    String name = thrown.getClass().getSimpleName();
                    if (thrown instanceof EvalException) {
                        name = ((EvalException) thrown).getExceptionClassName();
                    }
                    StringBuilder trace = new StringBuilder(name);
                    if (thrown.getMessage() != null) trace.append(": ").append(thrown.getMessage());
                    for (StackTraceElement element : thrown.getStackTrace()) {
                        trace.append("\n\tat ").append(element);
                    }
                    write(folder, "error_type", name.substring(name.lastIndexOf('.') + 1));
                    write(folder, "error_message", String.valueOf(thrown.getMessage()));
                    write(folder, "traceback", trace.toString());
                    return "error";
                }
                String type = null;
                if (snippet instanceof ExpressionSnippet) {
                    type = ((ExpressionSnippet) snippet).typeName();
                } else if (snippet instanceof VarSnippet
                        && snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
                    type = ((VarSnippet) snippet).typeName();
                }
                if (type != null) {
                    value = shown(type, event.value());
                }
            }
            if (interrupted) return "interrupted";
        }
        if (value != null) write(folder, "value", value);
        return "ok";
    }

    // A String as its text (jshell shows it as a literal); anything else as jshell shows it.
    static String shown(String type, String value) {
        if (value == null || type.equals("void")) return null;
        if (!type.equals("String") || !value.startsWith("\"") || value.length() < 2) return value;
        String body = value.substring(1, value.length() - 1);
        StringBuilder text = new StringBuilder();
        for (int i = 0; i < body.length(); i++) {
            char c = body.charAt(i);
            if (c != '\\' || i + 1 == body.length()) { text.append(c); continue; }
            char next = body.charAt(++i);
            switch (next) {
                case 'n': text.append('\n'); break;
                case 't': text.append('\t'); break;
                case 'r': text.append('\r'); break;
                case 'b': text.append('\b'); break;
                case 'f': text.append('\f'); break;
                case '0': text.append('\0'); break;
                case 'u':
                    if (i + 4 < body.length()) {
                        text.append((char) Integer.parseInt(body.substring(i + 1, i + 5), 16));
                        i += 4;
                        break;
                    }
                    text.append(next);
                    break;
                default: text.append(next);
            }
        }
        return text.toString();
    }
}
"""


class JavaAdapter(DriverAdapter):
    LANGUAGE = "Java"
    DRIVER_NAME = "Driver.java"
    DRIVER = DRIVER
    CELL_NAME = "cell.java"

    def argv(self, driver: str, token: str, folder: str) -> "list[str]":
        return [*JAVA_ARGV, driver, token, folder]

    def env_file(self, env: "dict[str, str]") -> str:
        return "".join(f"{name}\0{value}\0" for name, value in env.items())

    def find_version(self) -> str:
        # The JDK's release file: a second JVM just to print its version costs a second or more.
        java = shutil.which("java")
        release = os.path.join(os.path.dirname(os.path.realpath(java or "/")), "..", "release")
        try:
            with open(release, encoding="utf-8", errors="replace") as file:
                for line in file:
                    if line.startswith("JAVA_VERSION="):
                        return "Java " + line.partition("=")[2].strip().strip('"')[:32]
        except OSError:
            pass
        return "Java (unknown)"


if __name__ == "__main__":
    os._exit(run(JavaAdapter))
