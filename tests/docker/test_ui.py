"""The operations page (``/ui``) of a real ``sandhold serve``, driven in headless Chromium over
the DevTools protocol as an operator uses it: the key typed into its form (kept in the tab,
never in the page or its address), a session made through the API appearing with its id,
tenant and policy and then its memory; pause and resume freezing and thawing its container;
kill removing the container (checked through the Docker SDK) and the row; an operation name a
tenant sent shown as text, never made into markup.

Chromium comes from ``tests.chromium.find_chromium`` (Debian's package, installed when this
runs as root on Debian); without it the tests fail under CI=true and skip elsewhere, naming the
fix.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import docker
import httpx
import pytest

from orchestrator.backend.base import LABEL_SESSION
from orchestrator.images import ImageBuildResult
from tests.chromium import ChromiumMissing, Page, find_chromium, open_browser, survivors
from tests.conftest import IN_CI
from tests.docker.test_serve import CALL_TIMEOUT, STOP_TIMEOUT, Server, running

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# The page polls every 2 s and memory comes from the engine's stats (about 1 s each): a few
# polls, with room for a loaded machine.
PAGE_TIMEOUT = 60.0
# Markup a tenant can put in an audit record: an operation name is recorded as sent.
HOSTILE_OPERATION = '<img src=x onerror="document.title=`owned`">'


@pytest.fixture(scope="session")
def chromium() -> str:
    try:
        return find_chromium()
    except ChromiumMissing as missing:
        if IN_CI:
            pytest.fail(f"CI is set and the browser tests cannot run: {missing}", pytrace=False)
        pytest.skip(str(missing))


@pytest.fixture
async def page(chromium: str, tmp_path: Path) -> AsyncIterator[Page]:
    directory = tmp_path / "chromium"
    async with open_browser(chromium, directory) as opened:
        yield opened
        assert opened.errors == [], "the page's scripts threw"
    left = await anyio.to_thread.run_sync(survivors, directory / "profile")
    assert left == [], "the browser left processes behind"


@pytest.fixture
async def server(
    worker_image: ImageBuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Server]:
    monkeypatch.setenv("SANDHOLD_AUDIT_DIR", str(tmp_path / "audit"))
    async with running(worker_image.tag, tmp_path) as started:
        yield started
        started.process.send_signal(signal.SIGTERM)  # so it removes what it made
        with anyio.fail_after(STOP_TIMEOUT):
            await started.process.wait()


def key_of(server: Server) -> str:
    return server.notice.rsplit(": ", 1)[1]


def container_status(session_id: str) -> str | None:
    """The session's container as the engine has it (None: there is none)."""
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"})
        return None if not found else str(found[0]["State"])
    finally:
        client.close()


async def new_session(server: Server) -> str:
    headers = {"Authorization": f"Bearer {key_of(server)}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        with anyio.fail_after(CALL_TIMEOUT):
            made = await http.post("/v1/sessions", json={"code": "x = 1"})
            await http.post("/v1/python_repl", json={"operation": HOSTILE_OPERATION})
    assert made.status_code == 200, made.text
    return str(made.json()["session_id"])


async def sign_in(page: Page, server: Server) -> None:
    await page.goto(f"{server.url}/ui")
    await page.wait_for("!document.getElementById('key-form').hidden")
    await page.click("#key")
    await page.type(key_of(server))
    await page.click("#open")
    await page.wait_for("!document.getElementById('dashboard').hidden")


def row(session_id: str) -> str:
    return f'#sessions tr[data-session-id="{session_id}"]'


def cell(session_id: str, column: str) -> str:
    selector = f"{row(session_id)} td.col-{column}"
    return f"document.querySelector({json.dumps(selector)})?.textContent"


async def test_the_page_shows_a_session_and_its_kill_button_removes_the_container(
    page: Page, server: Server
) -> None:
    session_id = await new_session(server)
    await sign_in(page, server)
    await page.wait_for(
        f"document.querySelector({json.dumps(row(session_id))})", timeout=PAGE_TIMEOUT
    )
    assert await page.evaluate(cell(session_id, "session_id")) == session_id
    assert await page.evaluate(cell(session_id, "tenant")) == "local"
    assert await page.evaluate(cell(session_id, "policy")) == "default"
    memory = await page.wait_for(
        f"({cell(session_id, 'memory')} || '').includes('MiB') && {cell(session_id, 'memory')}",
        timeout=PAGE_TIMEOUT,
    )
    assert memory.endswith("MiB")

    # The key lives in the tab's storage only: not in the document, not in its address.
    key = key_of(server)
    assert await page.evaluate("sessionStorage.getItem('sandhold.apiKey')") == key
    assert key not in await page.evaluate("document.documentElement.outerHTML")
    assert key not in await page.evaluate("location.href")

    # What a tenant sent is shown as text: no element was made of it, no script ran.
    shown = await page.wait_for(
        f"[...document.querySelectorAll('#audit td')].some(td => td.textContent === "
        f"{json.dumps(HOSTILE_OPERATION)})",
        timeout=PAGE_TIMEOUT,
    )
    assert shown is True
    assert await page.evaluate("document.querySelectorAll('#audit img').length") == 0
    assert await page.evaluate("document.title") == "sandhold operations"

    assert container_status(session_id) == "running"
    await page.click(f"{row(session_id)} button.kill")
    await page.wait_for(
        f"!document.querySelector({json.dumps(row(session_id))})", timeout=PAGE_TIMEOUT
    )
    assert page.dialogs == [f"End session {session_id} and remove its container?"]
    assert container_status(session_id) is None
    # The kill is a tool call like any other: it is in the audit events the page shows.
    await page.wait_for(
        "[...document.querySelectorAll('#audit tr')].some(tr => "
        "tr.children[3]?.textContent === 'destroy' && "
        f"tr.children[4]?.textContent === {json.dumps(session_id)})",
        timeout=PAGE_TIMEOUT,
    )


async def test_pause_and_resume_freeze_and_thaw_the_sessions_container(
    page: Page, server: Server
) -> None:
    session_id = await new_session(server)
    await sign_in(page, server)
    await page.wait_for(
        f"document.querySelector({json.dumps(row(session_id))})", timeout=PAGE_TIMEOUT
    )
    state = f"document.querySelector({json.dumps(row(session_id))})?.dataset.state"

    await page.click(f"{row(session_id)} button.pause")
    await page.wait_for(f"{state} === 'paused'", timeout=PAGE_TIMEOUT)
    assert container_status(session_id) == "paused"
    assert (
        await page.evaluate(
            f"document.querySelector({json.dumps(row(session_id) + ' button.pause')}).textContent"
        )
        == "Resume"
    )

    await page.click(f"{row(session_id)} button.pause")
    await page.wait_for(f"{state} === 'idle'", timeout=PAGE_TIMEOUT)
    assert container_status(session_id) == "running"


async def test_a_wrong_key_brings_the_form_back_saying_why(page: Page, server: Server) -> None:
    await page.goto(f"{server.url}/ui")
    await page.click("#key")
    await page.type("sandhold_" + "x" * 43)
    await page.click("#open")
    message = await page.wait_for(
        "!document.getElementById('key-form').hidden && "
        "document.getElementById('status').textContent",
        timeout=PAGE_TIMEOUT,
    )
    assert "401" in message
    assert await page.evaluate("sessionStorage.getItem('sandhold.apiKey')") is None
