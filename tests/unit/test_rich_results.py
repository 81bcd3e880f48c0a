"""Rich results in the worker (worker/display.py), with the worker as a local subprocess: the
display protocol's hooks, ``display()``, the final expression, budgets, and every bundle passing
the host's own check (``protocol.checked_bundle``). Figures need matplotlib, which only the
python-data template has: tests/docker/test_rich_results.py covers them in a container."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.session.repl.protocol import bundle_size, checked_bundle
from tests.unit.test_repl_worker_protocol import WorkerProcess, start, worker_config

PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\0" * 32

HOOKS = f"""
class Html:
    def _repr_html_(self):
        return "<table><tr><td>1</td></tr></table>"
    def __repr__(self):
        return "Html()"

class Markdown:
    def _repr_markdown_(self):
        return "# title"

class Png:
    def _repr_png_(self):
        return {PNG_BYTES!r}

class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {{"text/plain": "bundle", "application/json": {{"a": [1, 2]}}}}, {{}}

class Broken:
    def _repr_html_(self):
        raise RuntimeError("no html today")
    def _repr_markdown_(self):
        return 42  # not a str: left out
"""
# Restricted mode refuses __getattr__ itself.
PROXY = """
class Proxy:
    def __getattr__(self, name):
        return lambda *a, **k: "anything"
"""


@pytest.fixture(params=["restricted", "unrestricted"])
def worker(request: pytest.FixtureRequest) -> Iterator[WorkerProcess]:
    process = start(worker_config(request.param, max_result_bytes=64 * 1024))
    assert process.execute(HOOKS)["success"]
    yield process
    process.close()


def results_of(worker: WorkerProcess, code: str) -> list[dict[str, Any]]:
    reply = worker.execute(code)
    assert reply["success"], reply
    bundles: list[dict[str, Any]] = reply["results"]
    for bundle in bundles:
        checked_bundle(bundle)
    return bundles


def test_a_final_expression_with_html_is_the_main_result(worker: WorkerProcess) -> None:
    reply = worker.execute("Html()")
    assert reply["result_repr"] == "Html()"
    assert reply["results"] == [
        {
            "text/plain": "Html()",
            "text/html": "<table><tr><td>1</td></tr></table>",
            "is_main_result": True,
        }
    ]


def test_display_shows_each_object_in_order_before_the_main_result(worker: WorkerProcess) -> None:
    bundles = results_of(worker, "display(Markdown(), Png())\ndisplay(3)\n'last'")
    assert [sorted(b) for b in bundles] == [
        ["text/markdown", "text/plain"],
        ["image/png", "text/plain"],
        ["text/plain"],
        ["is_main_result", "text/plain"],
    ]
    assert bundles[0]["text/markdown"] == "# title"
    assert base64.b64decode(bundles[1]["image/png"]) == PNG_BYTES
    assert bundles[2]["text/plain"] == "3"
    assert bundles[3]["text/plain"] == "'last'"


def test_a_mimebundle_hook_and_broken_hooks(worker: WorkerProcess) -> None:
    bundles = results_of(worker, "display(Bundle(), Broken())")
    assert bundles[0] == {"text/plain": "bundle", "application/json": {"a": [1, 2]}}
    assert list(bundles[1]) == ["text/plain"]  # both hooks failed: text only


def test_an_object_answering_every_attribute_offers_only_text() -> None:
    worker = start(worker_config("unrestricted"))
    try:
        worker.execute(PROXY)
        assert [list(b) for b in results_of(worker, "display(Proxy())")] == [["text/plain"]]
    finally:
        worker.close()


def test_a_cell_without_a_value_or_display_has_no_results(worker: WorkerProcess) -> None:
    assert results_of(worker, "x = Html()") == []
    assert results_of(worker, "None") == []


def test_a_representation_over_the_budget_is_left_out_and_said(worker: WorkerProcess) -> None:
    worker.execute("class Huge:\n    def _repr_png_(self):\n        return b'x' * 100_000\n")
    reply = worker.execute("display(Huge(), Html())")
    huge, html = reply["results"]
    assert "image/png" not in huge and huge["truncated"] is True
    assert "text/html" in html  # the budget the image did not use is still there
    assert reply["truncated"] is True
    assert sum(bundle_size(b) for b in reply["results"]) <= 64 * 1024


def test_display_past_the_count_limit_is_counted_not_kept(worker: WorkerProcess) -> None:
    reply = worker.execute("for i in range(150):\n    display(i)\n")
    assert len(reply["results"]) == 100
    assert reply["results_dropped"] == 50
    assert reply["truncated"] is True


def test_display_outside_a_cell_goes_nowhere() -> None:
    worker = start(worker_config("unrestricted"))
    try:
        worker.execute("import threading, time\nshow = display")
        worker.execute("threading.Timer(0.05, lambda: show('late')).start()")
        worker.execute("time.sleep(0.2)")
        assert results_of(worker, "1") == [{"text/plain": "1", "is_main_result": True}]
    finally:
        worker.close()


@pytest.mark.parametrize(
    "bundle",
    [
        {"text/html": "<b>"},  # no text/plain
        {"text/plain": "x", "image/png": "not base64!"},
        {"text/plain": "x", "application/x-evil": "1"},
        {"text/plain": "x", "is_main_result": "yes"},
        {"text/plain": 3},
        {"text/plain": "x", "application/json": "a string"},
    ],
)
def test_the_host_refuses_a_bundle_no_worker_makes(bundle: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="a result"):
        checked_bundle(bundle)
