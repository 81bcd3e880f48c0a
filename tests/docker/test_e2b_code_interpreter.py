"""E2B's code interpreter SDK (``e2b-code-interpreter`` 2.11, pinned), unmodified, against
``sandhold serve --e2b-port``: ``run_code`` under ``code-interpreter-v1`` (sandhold's
code-interpreter template: python-data and node, built on first use) keeps state between
cells, streams stdout, returns an error with its traceback, a matplotlib figure as a PNG and a
DataFrame as HTML and data; contexts, bash and JavaScript; a sandbox killed mid-run; a PTY
takes input and a resize."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator

import pytest
from e2b import NotFoundException, PtySize, TimeoutException
from e2b_code_interpreter import Sandbox

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A cell's start, or the end of a call on a killed sandbox, comes within seconds.
CALL_WAIT = 60.0
# The code-interpreter template is built on first use (some minutes on a cold cache).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-ci")) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox(server: E2bServer) -> Iterator[Sandbox]:
    made = Sandbox.create(request_timeout=600)
    try:
        yield made
    finally:
        made.kill()


def test_run_code_keeps_state_and_streams_stdout(sandbox: Sandbox) -> None:
    printed: list[str] = []
    sandbox.run_code("x = 41\nprint('first')")
    ran = sandbox.run_code("print('second')\nx + 1", on_stdout=lambda m: printed.append(m.line))
    assert ran.error is None
    assert ran.logs.stdout == ["second\n"] and printed == ["second\n"]
    assert ran.text == "42"


def test_an_exception_comes_back_with_its_traceback(sandbox: Sandbox) -> None:
    ran = sandbox.run_code("def f():\n    return 1 / 0\nf()")
    assert ran.error is not None
    assert ran.error.name == "ZeroDivisionError"
    assert "division by zero" in ran.error.value
    assert "Traceback" in ran.error.traceback and "return 1 / 0" in ran.error.traceback


def test_a_figure_is_a_png_and_a_dataframe_is_html(sandbox: Sandbox) -> None:
    ran = sandbox.run_code(
        "import matplotlib.pyplot as plt, pandas as pd\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "pd.DataFrame({'a': [1, 2], 'b': [3, 4]})"
    )
    assert ran.error is None
    pngs = [r.png for r in ran.results if r.png]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(PNG_MAGIC)
    main = [r for r in ran.results if r.is_main_result]
    assert len(main) == 1 and main[0].html is not None and "<table" in main[0].html


def test_ipython_cell_rules_and_a_tables_data(sandbox: Sandbox) -> None:
    shown: list[str] = []
    ran = sandbox.run_code(
        "    from IPython.display import display\n"
        "    display({'text/plain': 'p', 'text/html': '<b>h</b>'}, raw=True)",
        on_result=lambda result: shown.append(result.html),
    )
    assert ran.error is None and ran.results[0].html == "<b>h</b>" and shown == ["<b>h</b>"]
    table = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
    assert table.results[0].data == {"a": [1, 2], "b": ["x", None]}
    assert "data" in table.results[0].formats()


def test_a_language_without_a_kernel_is_refused_clearly(sandbox: Sandbox) -> None:
    ran = sandbox.run_code("print(1)", language="cobol")
    assert ran.error is not None and ran.error.name == "invalid_argument"
    assert "no language of that name" in ran.error.value and "'cobol'" in ran.error.value
    # R's kernel is in code-interpreter-full, not in code-interpreter-v1's image.
    elsewhere = sandbox.run_code("print(1)", language="r")
    assert elsewhere.error is not None and elsewhere.error.name == "invalid_argument"
    assert "the r kernel could not start" in elsewhere.error.value


def test_javascript_runs_in_its_own_context(sandbox: Sandbox) -> None:
    sandbox.run_code("let count = 2", language="js")
    ran = sandbox.run_code("console.log('from node'); count * 21", language="javascript")
    assert ran.error is None and ran.logs.stdout == ["from node\n"] and ran.text == "42"
    failed = sandbox.run_code("null.x", language="js")
    assert failed.error is not None and failed.error.name == "TypeError"


def test_python_and_javascript_are_listed_before_their_first_use_where_node_is(
    sandbox: Sandbox, server: E2bServer
) -> None:
    """As E2B lists a default context per language up front; JavaScript's is made on first use,
    and a sandbox without node (``base``) lists none."""
    languages = {c.language for c in sandbox.list_code_contexts()}
    assert {"python", "javascript"} <= languages
    made = sandbox.create_code_context()
    assert sandbox.list_code_contexts()[-1].id == made.id  # the newest is listed last
    sandbox.remove_code_context(made)
    assert sandbox.run_code("40 + 2", language="javascript").text == "42"
    listed = [c for c in sandbox.list_code_contexts() if c.language == "javascript"]
    assert [c.id for c in listed] == ["javascript"]
    plain = Sandbox.create("base", request_timeout=600)
    try:
        assert {c.language for c in plain.list_code_contexts()} == {"python"}
    finally:
        plain.kill()


def test_code_contexts_keep_their_own_state_and_cwd(sandbox: Sandbox) -> None:
    sandbox.run_code("y = 'default'")
    sandbox.files.make_dir("/home/user/ctx-dir-test")
    made = sandbox.create_code_context(cwd="/home/user/ctx-dir-test")
    assert made.language == "python" and made.cwd == "/home/user/ctx-dir-test"
    assert (
        sandbox.run_code("import os\nos.getcwd()", context=made).text == "/workspace/ctx-dir-test"
    )
    # A str result is shown as the string, as E2B's kernel shows it (a REPL shows its repr).
    assert sandbox.run_code("y = 'mine'\ny", context=made).text == "mine"
    assert sandbox.run_code("y").text == "default"
    assert sandbox.run_code("[y]").text == "['default']"
    listed = {c.id: c for c in sandbox.list_code_contexts()}
    assert listed["default"].cwd == "/home/user" and made.id in listed
    sandbox.restart_code_context(made)
    gone = sandbox.run_code("y", context=made)
    assert gone.error is not None and gone.error.name == "NameError"
    sandbox.remove_code_context(made.id)
    assert made.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=made)


def test_bash_runs_in_its_own_context_by_language(sandbox: Sandbox) -> None:
    printed: list[str] = []
    sandbox.run_code("COUNT=2; cd /tmp", language="bash")
    ran = sandbox.run_code(
        "echo $COUNT $(pwd)", language="bash", on_stdout=lambda m: printed.append(m.line)
    )
    assert ran.logs.stdout == ["2 /tmp\n"] and printed == ["2 /tmp\n"]
    failed = sandbox.run_code("ls /no-such-dir", language="bash")
    assert failed.error is not None and failed.error.name == "ExitCode"
    shell = sandbox.create_code_context(language="bash")
    assert sandbox.run_code("pwd", context=shell).logs.stdout == ["/workspace\n"]


def test_a_pty_takes_input_and_a_resize(sandbox: Sandbox) -> None:
    seen = bytearray()
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.resize(handle.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(handle.pid, b"stty size; echo pty-$((6*7)); exit\n")
    result = handle.wait(on_pty=lambda data: seen.extend(data))
    assert result.exit_code == 0
    assert b"40 120" in seen and b"pty-42" in seen


def test_a_sandbox_killed_during_run_code_ends_the_call_with_e2bs_error(server: E2bServer) -> None:
    doomed = Sandbox.create(request_timeout=600)
    started = threading.Event()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["execution"] = doomed.run_code(
                "print('started', flush=True)\nimport time\ntime.sleep(120)",
                on_stdout=lambda _: started.set(),
                timeout=300,
            )
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(CALL_WAIT)
    doomed.kill()
    thread.join(CALL_WAIT)
    assert not thread.is_alive(), "run_code still waits on a killed sandbox"
    error = outcome.get("error")
    assert isinstance(error, TimeoutException) and "killed" in str(error), outcome
