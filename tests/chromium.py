"""Headless Chromium for tests that drive a page, over the DevTools protocol (CDP).

``find_chromium`` returns the browser's path, installing Debian's ``chromium`` package first
when there is none and this process is root on a system with apt-get (as the image build does
for debootstrap: CI installs nothing the README's commands do not); ``ChromiumMissing`` names
the fix when that cannot be done.

``open_browser`` starts one browser with a profile of its own (``--user-data-dir`` under the
test's temporary directory), in a process group of its own that is killed whole on every way
out, and opens one page; ``Page`` holds the CDP session of that page: ``evaluate`` a script,
``wait_for`` an expression to hold, ``click`` an element as a person does (mouse events at its
centre), ``type`` into the focused element. JavaScript dialogs (``confirm``) are accepted and
their messages kept in ``Page.dialogs``; the page's uncaught exceptions in ``Page.errors``.

Every wait is bounded: each command by ``COMMAND_TIMEOUT``, start-up by ``START_TIMEOUT``, each
``wait_for`` by its timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from websockets.asyncio.client import ClientConnection, connect

log = logging.getLogger(__name__)

NAMES = ("chromium", "chromium-browser")
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
APT_UPDATE = ("apt-get", "update", "-q")
APT_INSTALL = ("apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium")
# apt-get update, then Chromium and its libraries (some 100 MB) from a slow mirror.
APT_TIMEOUT = 900.0
FIX = (
    "install Chromium (Debian: `apt-get install chromium`; elsewhere put `chromium` or "
    "`chromium-browser` on PATH), or run the tests as root on Debian, where they install it"
)
# A cold start of headless Chromium takes a second or two; a loaded CI machine, more.
START_TIMEOUT = 60.0
# One CDP command; a click that opens a dialog answers once the dialog is handled.
COMMAND_TIMEOUT = 30.0
# How often ``wait_for`` looks again: the page itself changes at most every poll (2 s).
WAIT_STEP = 0.1
# The browser gets this long to go once its group was sent SIGKILL.
KILL_TIMEOUT = 10.0


class ChromiumMissing(Exception):
    """No Chromium here, and none could be installed; the message names the fix."""


class CdpError(Exception):
    """A CDP command failed, or a script threw."""


def find_chromium() -> str:
    """The browser's path, installed first where that can be done here."""
    found = _on_path()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ChromiumMissing(f"no Chromium on PATH and no way to install it here: {FIX}")
    for argv in (APT_UPDATE, APT_INSTALL):
        log.warning("no Chromium on PATH: running %s", " ".join(argv))
        try:
            done = subprocess.run(
                argv,
                env={**os.environ, **APT_ENV},
                capture_output=True,
                text=True,
                timeout=APT_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ChromiumMissing(f"{' '.join(argv)} took over {APT_TIMEOUT:g} s: {FIX}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise ChromiumMissing(f"{' '.join(argv)} failed ({done.returncode}): {tail}\n{FIX}")
    found = _on_path()
    if found is None:
        raise ChromiumMissing(f"apt-get installed chromium, yet it is not on PATH: {FIX}")
    log.warning("installed Chromium: %s", found)
    return found


def _on_path() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def browser_argv(binary: str, profile: Path) -> list[str]:
    argv = [
        binary,
        "--headless=new",
        "--remote-debugging-port=0",
        "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-sync",
        "--disable-gpu",
        "--mute-audio",
        "--password-store=basic",
        "about:blank",
    ]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses root without it; a test browser
    return argv


class Cdp:
    """One websocket to the browser: commands matched to answers by id, events to handlers."""

    def __init__(self, socket: ClientConnection, group: anyio.abc.TaskGroup) -> None:
        self._socket = socket
        self._group = group
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self._handlers: dict[str, list[Callable[[dict[str, Any]], None]]] = {}

    def on(self, method: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self._handlers.setdefault(method, []).append(handler)

    def soon(self, method: str, params: dict[str, Any], session: str | None) -> None:
        """Send a command from an event handler, without waiting for its answer there."""
        self._group.start_soon(self.send, method, params, session)

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        *,
        timeout: float = COMMAND_TIMEOUT,
    ) -> dict[str, Any]:
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        done, answer = anyio.Event(), []
        self._waiting[number] = (done, answer)
        try:
            await self._socket.send(json.dumps(message))
            with anyio.fail_after(timeout):
                await done.wait()
        finally:
            self._waiting.pop(number, None)
        if "error" in answer[0]:
            raise CdpError(f"{method}: {answer[0]['error']}")
        return dict(answer[0].get("result", {}))

    async def read(self) -> None:
        async for raw in self._socket:
            message = json.loads(raw)
            if "id" in message:
                waiting = self._waiting.get(message["id"])
                if waiting is not None:
                    waiting[1].append(message)
                    waiting[0].set()
                continue
            for handler in self._handlers.get(message.get("method", ""), ()):
                handler(message)


class Page:
    """One page of the browser, through its flat CDP session."""

    def __init__(self, cdp: Cdp, session: str) -> None:
        self._cdp = cdp
        self._session = session
        self.dialogs: list[str] = []
        # Uncaught exceptions of the page's own scripts, as the console would show them.
        self.errors: list[str] = []
        cdp.on("Page.javascriptDialogOpening", self._accept_dialog)
        cdp.on("Runtime.exceptionThrown", self._note_exception)

    def _note_exception(self, message: dict[str, Any]) -> None:
        if self._mine(message):
            details = message["params"]["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details["text"])

    def _accept_dialog(self, message: dict[str, Any]) -> None:
        if not self._mine(message):
            return
        self.dialogs.append(str(message["params"].get("message")))
        self._cdp.soon("Page.handleJavaScriptDialog", {"accept": True}, self._session)

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float = COMMAND_TIMEOUT,
    ) -> dict[str, Any]:
        return await self._cdp.send(method, params, self._session, timeout=timeout)

    async def goto(self, url: str) -> None:
        loaded = anyio.Event()
        self._cdp.on("Page.loadEventFired", lambda message: self._mine(message) and loaded.set())
        answer = await self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise CdpError(f"navigating to {url}: {answer['errorText']}")
        with anyio.fail_after(COMMAND_TIMEOUT):
            await loaded.wait()

    def _mine(self, message: dict[str, Any]) -> bool:
        return message.get("sessionId") == self._session

    async def evaluate(self, expression: str, *, timeout: float = COMMAND_TIMEOUT) -> Any:
        answer = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout=timeout,
        )
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"{expression!r} threw: {text}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, *, timeout: float = 30.0) -> Any:
        """The expression's first truthy value: looked at now and after every change to the
        document (a MutationObserver in the page), so nothing polls."""
        script = f"""new Promise((resolve) => {{
            const look = () => {{
                let value;
                try {{ value = ({expression}); }} catch (_) {{ value = undefined; }}
                if (value) {{ observer.disconnect(); resolve(value); }}
            }};
            const observer = new MutationObserver(look);
            observer.observe(document, {{
                subtree: true, childList: true, attributes: true, characterData: true,
            }});
            look();
        }})"""
        with anyio.move_on_after(timeout):
            return await self.evaluate(script, timeout=timeout + COMMAND_TIMEOUT)
        raise TimeoutError(
            f"{expression} did not hold in {timeout:g} s; page errors: {self.errors}"
        )

    async def click(self, selector: str) -> None:
        """A left click at the centre of the element, through the browser's input pipeline."""
        centre = await self.evaluate(
            f"""(() => {{
                const element = document.querySelector({json.dumps(selector)});
                if (!element) return null;
                element.scrollIntoView({{block: "center"}});
                const box = element.getBoundingClientRect();
                return [box.x + box.width / 2, box.y + box.height / 2];
            }})()"""
        )
        if not centre:
            raise CdpError(f"nothing to click: {selector}")
        x, y = centre
        await self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    async def type(self, text: str) -> None:
        await self.send("Input.insertText", {"text": text})


@contextlib.asynccontextmanager
async def open_browser(binary: str, directory: Path) -> AsyncIterator[Page]:
    """A headless browser with its own profile in ``directory``, and one blank page in it; what
    the browser writes goes to ``directory / "chromium.log"``."""
    profile = directory / "profile"
    profile.mkdir(parents=True)
    process = await anyio.open_process(
        browser_argv(binary, profile),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, killed whole below
    )
    try:
        async with anyio.create_task_group() as group:
            listening = Listening()
            group.start_soon(_keep_output, process, directory / "chromium.log", listening)
            with anyio.fail_after(START_TIMEOUT):
                await listening.known.wait()
            if listening.url is None:
                raise CdpError(f"Chromium ended at start; see {directory / 'chromium.log'}")
            async with connect(listening.url, max_size=None, open_timeout=START_TIMEOUT) as ws:
                cdp = Cdp(ws, group)
                group.start_soon(cdp.read)
                target = await cdp.send("Target.createTarget", {"url": "about:blank"})
                attached = await cdp.send(
                    "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
                )
                page = Page(cdp, attached["sessionId"])
                await page.send("Page.enable")
                await page.send("Runtime.enable")
                yield page
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _kill_group(process)


class Listening:
    """Where the browser's CDP listens, once it said so (None: it ended without saying)."""

    def __init__(self) -> None:
        self.known = anyio.Event()
        self.url: str | None = None


async def _keep_output(process: anyio.abc.Process, path: Path, listening: Listening) -> None:
    """Copy the browser's stderr to ``path`` until it ends, noting the line with its address."""
    assert process.stderr is not None
    prefix = b"DevTools listening on "
    pending = b""
    async with await anyio.open_file(path, "wb") as log_file:
        try:
            async for chunk in process.stderr:
                await log_file.write(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.startswith(prefix) and listening.url is None:
                        listening.url = line[len(prefix) :].decode().strip()
                        listening.known.set()
        finally:
            listening.known.set()


async def _kill_group(process: anyio.abc.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with anyio.move_on_after(KILL_TIMEOUT) as waited:
        await process.wait()
    if waited.cancelled_caught:
        log.error("Chromium (pid %d) did not end within %g s of SIGKILL", process.pid, KILL_TIMEOUT)
    with anyio.move_on_after(KILL_TIMEOUT):
        await process.aclose()  # its pipe, so no transport is left for the event loop's end


def processes_using(profile: Path) -> list[int]:
    """Live processes whose command line names ``profile``: what a browser of it left running
    (zombies, already dead, are not counted)."""
    found = []
    marker = str(profile).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            if state not in (b"Z", b"X") and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def survivors(profile: Path, *, timeout: float = KILL_TIMEOUT) -> list[int]:
    """``processes_using(profile)`` once it is empty, or after ``timeout``: a process sent
    SIGKILL may take a moment to be gone, and nothing tells another process when it is."""
    deadline = time.monotonic() + timeout
    while (left := processes_using(profile)) and time.monotonic() < deadline:
        time.sleep(WAIT_STEP)
    return left
