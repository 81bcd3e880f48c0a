"""The documentation keeps to the code: the generated reference pages are what the generator
makes now, every relative link of docs/ and the README leads to a file, and the OpenAPI document
the HTTP page points at describes every response with a schema."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from pydantic import BaseModel

from orchestrator.docs_reference import PAGES, render_pages, stale_pages, write_pages
from orchestrator.docs_reference.__main__ import main
from orchestrator.docs_reference._results import ResultShape
from orchestrator.docs_reference._tools import _result_rows
from orchestrator.http import openapi_document

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m orchestrator.docs_reference"
# [text](target) and [text]: target; images too. Code spans and fenced blocks are cut first.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


@pytest.mark.parametrize("path", list(PAGES))
def test_the_committed_reference_page_is_what_the_code_makes(path: str) -> None:
    committed = ROOT / path
    assert committed.is_file(), f"{path} is missing: run `{REGENERATE}` and commit it"
    expected = render_pages()[path]
    actual = committed.read_text(encoding="utf-8")
    if actual != expected:
        pairs = zip(actual.splitlines(), expected.splitlines(), strict=False)
        differing = next((n for n, (a, b) in enumerate(pairs, 1) if a != b), "the end")
        pytest.fail(
            f"{path} differs from what the code makes (first at line {differing}): the tool "
            f"definitions, the error types or the policy model changed. Run `{REGENERATE}` "
            "from the checkout's root and commit the page."
        )


def test_the_check_entry_point_tells_a_stale_page_from_a_current_one(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    assert main(["--check", str(tmp_path)]) == 1  # missing pages are stale
    write_pages(tmp_path)
    assert stale_pages(tmp_path) == [] and main(["--check", str(tmp_path)]) == 0
    page = tmp_path / "docs/reference/policy.md"
    page.write_text(page.read_text().replace("`512`", "`513`"))
    assert stale_pages(tmp_path) == ["docs/reference/policy.md"]


def test_a_result_field_without_a_meaning_stops_the_generator() -> None:
    class Unexplained(BaseModel):
        novel: int

    with pytest.raises(ValueError, match=r"Unexplained\.novel"):
        _result_rows(ResultShape(model=Unexplained))


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _targets(text: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return [m[1] or m[2] for m in LINK.finditer(text)]


def test_every_relative_link_in_the_docs_and_the_readme_leads_to_a_file() -> None:
    broken = []
    for document in _documents():
        for target in _targets(document.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or a place in the same page
            path = unquote(target.split("#", 1)[0])
            if not (document.parent / path).exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_link_reader_finds_inline_and_reference_links_but_not_code() -> None:
    text = "[a](x.md) ![i](img.png) `[c](no.md)`\n[ref]: y.md\n```\n[f](no2.md)\n```\n"
    assert _targets(text) == ["x.md", "img.png", "y.md"]


def test_every_response_of_the_openapi_document_has_a_schema() -> None:
    document = openapi_document()
    missing = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                contents = response.get("content", {})
                if not contents or not all("schema" in c for c in contents.values()):
                    missing.append(f"{method.upper()} {path} {status}")
    assert missing == []


@pytest.mark.parametrize("name", ["sandhold.service", "compose.yaml", "Dockerfile.server"])
def test_the_operations_page_shows_each_deployment_file_as_it_is(name: str) -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert (ROOT / "docs" / "deploy" / name).read_text(encoding="utf-8") in page


def test_the_compose_file_runs_serve_with_the_engine_socket_and_a_data_volume() -> None:
    text = (ROOT / "docs" / "deploy" / "compose.yaml").read_text(encoding="utf-8")
    assert '"serve"' in text and "/var/run/docker.sock:/var/run/docker.sock" in text
    assert "sandhold-data:/data" in text and "127.0.0.1:8080:8080" in text
