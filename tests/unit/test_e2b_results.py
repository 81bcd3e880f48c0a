"""How a sandhold result bundle reads as E2B's ``Result``: a str main result shown as the string
(E2B's kernel), everything else as the worker gave it."""

from __future__ import annotations

import pytest

from orchestrator.http.e2b._interpreter import result_of


@pytest.mark.parametrize(
    ("plain", "shown"),
    [
        ("'bar'", "bar"),
        ('"it\'s"', "it's"),
        ("'a\\nb'", "a\nb"),
        ("42", "42"),
        ("['bar']", "['bar']"),
        ("'cut short...", "'cut short..."),
        ("'a' + 'b'", "'a' + 'b'"),
    ],
)
def test_a_main_result_that_is_one_str_literal_is_shown_unquoted(plain: str, shown: str) -> None:
    assert result_of({"is_main_result": True, "text/plain": plain})["text"] == shown


def test_a_result_with_other_forms_or_not_main_keeps_its_text() -> None:
    table = {"is_main_result": True, "text/plain": "'x'", "text/html": "<table/>"}
    assert result_of(table)["text"] == "'x'"
    assert result_of({"is_main_result": False, "text/plain": "'x'"})["text"] == "'x'"
