"""A real headless browser for the page's tests: Debian's `chromium`, driven through the DevTools protocol
over aiohttp's websocket client (no driver to install). It collects what a person's browser would complain
about (console errors, uncaught exceptions, failed loads, blocked requests) and every URL the page asked for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp

from mellum_proxy.observe import Changes

START_S = 30.0  # for the browser to open its DevTools port (a cold start on a busy machine)


def chromium_binary() -> str | None:
    """`$CHROMIUM`, else the first of Debian's and other distributions' names on the PATH."""
    named = os.environ.get("CHROMIUM")
    if named:
        return named
    return next(filter(None, (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))), None)


@dataclass
class Page:
    """One tab, through its DevTools websocket."""

    socket: aiohttp.ClientWebSocketResponse
    problems: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    urls: list[str] = field(default_factory=list)  # every request the page made
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    changes: Changes = field(default_factory=Changes)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _waiting: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[number] = answer
        await self.socket.send_json({"id": number, "method": method, "params": params})
        return cast(dict[str, Any], await answer)

    async def read(self) -> None:
        async for message in self.socket:
            data = message.json()
            if "id" in data:
                waiting = self._waiting.pop(data["id"], None)
                if waiting is not None and not waiting.done():
                    if "error" in data:
                        waiting.set_exception(RuntimeError(f"DevTools: {data['error']}"))
                    else:
                        waiting.set_result(data.get("result", {}))
                continue
            self._event(data.get("method", ""), data.get("params", {}))
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(ConnectionError("the browser went away"))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self.loaded.set()
        elif method == "Network.requestWillBeSent":
            self.urls.append(params["request"]["url"])
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            self.problems.append(f"load failed: {params.get('errorText')} {params.get('blockedReason', '')}")
        elif method == "Runtime.exceptionThrown":
            self.problems.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.problems.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.problems.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        self.changes.notify()

    async def open(self, url: str, timeout_s: float = 30.0) -> None:
        self.loaded.clear()
        await self.call("Page.navigate", url=url)
        async with asyncio.timeout(timeout_s):
            await self.loaded.wait()

    async def evaluate(self, expression: str, timeout_s: float = 10.0) -> Any:
        """The value of a JavaScript expression (a promise is awaited)."""
        async with asyncio.timeout(timeout_s):
            result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, predicate_js: str, timeout_s: float) -> Any:
        """Wait, inside the page, until `predicate_js` (an expression) is truthy: re-checked on each change of
        the document, no polling; returns its value."""
        script = f"""new Promise((resolve) => {{
            const check = () => {{ const value = ({predicate_js}); if (value) {{ resolve(value); return true; }} return false; }};
            if (!check()) {{
                const watch = new MutationObserver(() => {{ if (check()) watch.disconnect(); }});
                watch.observe(document.body, {{subtree: true, childList: true, characterData: true}});
            }}
        }})"""  # noqa: E501
        return await self.evaluate(script, timeout_s)

    async def screenshot(self, path: Path, whole: bool = True) -> None:
        """A PNG of the whole page, or (`whole=False`) of what the window shows."""
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=whole)
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def chromium(binary: str, width: int = 1400, height: int = 1100) -> AsyncIterator[Page]:
    """A headless Chromium with one tab, closed afterwards; its profile lives in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="mellum-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--window-size={width},{height}", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", "about:blank",
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        drain: asyncio.Task[None] | None = None
        try:
            port = await _devtools_port(process, Path(profile) / "DevToolsActivePort")
            assert process.stderr is not None
            drain = asyncio.create_task(_drain(process.stderr))  # a full pipe would stall the browser
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                target = next(t for t in targets if t["type"] == "page")
                async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                    page = Page(socket)
                    reader = asyncio.create_task(page.read())
                    for domain in ("Page", "Runtime", "Log", "Network"):
                        await page.call(f"{domain}.enable")
                    try:
                        yield page
                    finally:
                        reader.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await reader
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
            if drain is not None:
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drain


async def _devtools_port(process: asyncio.subprocess.Process, active: Path) -> int:
    """The port from the browser's own line on stderr (`DevTools listening on ws://...:PORT/...`)."""
    assert process.stderr is not None
    async with asyncio.timeout(START_S):
        while line := await process.stderr.readline():
            text = line.decode(errors="replace")
            if "DevTools listening on" in text:
                return int(text.rsplit(":", 1)[1].split("/", 1)[0])
    raise RuntimeError(f"chromium exited ({process.returncode}) without opening DevTools; {active} not written")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
