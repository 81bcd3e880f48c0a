"""E2B's code interpreter SDK (``e2b-code-interpreter`` 2.11, pinned), unmodified, against
``sandhold serve --e2b-port``: ``run_code`` under ``code-interpreter-v1`` (sandhold's
python-data template, built on first use) keeps state between cells, streams stdout, returns
an error with its traceback, a matplotlib figure as a PNG and a DataFrame as HTML; a PTY
takes input and a resize."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from e2b import PtySize
from e2b_code_interpreter import Sandbox

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The python-data template is built on first use (some minutes on a cold cache).
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


def test_a_non_python_language_is_refused_clearly(sandbox: Sandbox) -> None:
    with pytest.raises(Exception, match="not supported"):
        sandbox.run_code("console.log(1)", language="js")


def test_a_pty_takes_input_and_a_resize(sandbox: Sandbox) -> None:
    seen = bytearray()
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.resize(handle.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(handle.pid, b"stty size; echo pty-$((6*7)); exit\n")
    result = handle.wait(on_pty=lambda data: seen.extend(data))
    assert result.exit_code == 0
    assert b"40 120" in seen and b"pty-42" in seen
