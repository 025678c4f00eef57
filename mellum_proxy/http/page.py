"""The live page at `/`: what the completion stack is doing, in the browser, with nothing to install.

`/` and `/ui/{asset}` serve the page's three files from `mellum_proxy/ui/` (no build step, no CDN: a Content
Security Policy keeps every request on this origin). `/ui/events` is one server-sent event stream per open
page: the records kept for `/status` first, then the requests as they finish (`requests`), the suggestions
as their fate is known (`accepted`), at most five writes a second; and once a second the state (`state`:
`/status`'s answer, the deadline warning, and every few seconds `doctor`'s reading of the recent window).
The stream reads the records only when they change, in batches, and serializes them as they are (orjson
writes dataclasses natively) in its own task: with no page open a request costs nothing more.
Loopback and `--auth-token` apply as to every route (`mellum_proxy.http.guard`); no source text is sent unless
`--log-content` is on (the records hold none otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from mellum_proxy import __version__
from mellum_proxy.errors import NotFoundError, ServiceUnavailableError
from mellum_proxy.http.connections import STALLED_S  # a page that reads nothing this long is let go
from mellum_proxy.http.guard import check_host
from mellum_proxy.http.keys import POLICIES, RECORDS, SECTIONS, SERVICE, SETTINGS, STARTED, TELEMETRY, UPSTREAMS
from mellum_proxy.http.routes import status_body
from mellum_proxy.telemetry import RecentRecords
from mellum_proxy.telemetry.doctor import diagnose

ASSETS = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}
POLICY = (  # the page's own files, and its event stream: nothing else, from anywhere
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATE_EVERY_S = 1.0
EXPLAIN_EVERY_S = 5.0
BATCH_S = 0.2  # at most five writes a second, whatever the request rate: the page costs requests nothing
MAX_PAGES = 8  # event streams open at once: pages left open in tabs never crowd out the editor's connections
DOCTOR_READS = (
    "reached_upstream",
    "outcome",
    "prompt_tokens_before",
    "inflight",
    "ttft_ms",
    "vram_peak_mib",
    "wake_ms",
    "error",
    "draft_n",
    "draft_n_accepted",
)
PAGES = web.AppKey("pages", dict[str, int])  # "open": event streams open now; "closing": 1 once shutting down


def add_page_routes(app: web.Application) -> None:
    app[PAGES] = {"open": 0, "closing": 0}
    app.router.add_get("/", index)
    app.router.add_get("/ui/events", events)
    app.router.add_get("/ui/{name}", asset)
    app.on_shutdown.append(_end_streams)


async def _end_streams(app: web.Application) -> None:
    """Open pages would hold the shutdown for its whole grace: their streams end first."""
    app[PAGES]["closing"] = 1
    app[RECORDS].changes.notify()


@functools.cache
def _asset_bytes(name: str) -> bytes:
    """A file of the page, read once."""
    return resources.files("mellum_proxy.ui").joinpath(name).read_bytes()


async def index(request: web.Request) -> web.Response:
    return _serve(request, "index.html")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise NotFoundError(f"{request.path}: no such file of the page")
    return _serve(request, name)


def _serve(request: web.Request, name: str) -> web.Response:
    check_host(request, request.app[SECTIONS].listen)
    headers = {"Content-Security-Policy": POLICY, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    return web.Response(body=_asset_bytes(name), content_type=ASSETS[name], charset="utf-8", headers=headers)


def _event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def events(request: web.Request) -> web.StreamResponse:
    """The page's one stream: kept records, then every change as it happens, and the state each second."""
    app = request.app
    check_host(request, app[SECTIONS].listen)
    if app[PAGES]["open"] >= MAX_PAGES:
        raise ServiceUnavailableError(f"{MAX_PAGES} live pages are open already: close one (or reload it)")
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    request[STARTED] = True
    await stream.prepare(request)
    pages = app[PAGES]
    pages["open"] += 1
    app[RECORDS].changes.notify()
    try:
        try:
            await _relay(app, stream)
            await stream.write_eof()
        except ConnectionResetError:
            pass  # the page went away (or the shutdown closed it)
        except TimeoutError:  # it reads nothing: let it go
            if request.transport is not None:
                request.transport.abort()
    finally:
        pages["open"] -= 1
        app[RECORDS].changes.notify()
    return stream


async def _relay(app: web.Application, stream: web.StreamResponse) -> None:
    records, closing = app[RECORDS], app[PAGES]
    hello = {"version": __version__, "log_content": app[SETTINGS].log_content, "kept": len(records)}
    await stream.write(_event("hello", hello))
    telemetry = app[TELEMETRY]
    added = judged = chats = 0  # from the first kept
    next_state = explained_at = 0.0
    explained_added = -1
    while not closing["closing"]:
        out = []
        if new := records.records_since(added):
            out.append(_event("requests", new))  # orjson writes the records as they are: no copy
        if settled := records.judged_since(judged):
            out.append(_event("accepted", settled))
        if bulk := telemetry.bulk_since(chats):
            out.append(_event("chats", bulk))  # chats and agents: their own lane, table and chart
        added, judged, chats = records.added, records.judged_count, telemetry.bulk_added
        now = time.monotonic()
        if now >= next_state:
            await other_traffic(app)
            state = _state(app)
            if now - explained_at >= EXPLAIN_EVERY_S and explained_added != added:
                explained = diagnose([{key: getattr(r, key) for key in DOCTOR_READS} for r in records])
                state["explain"] = explained
                explained["evidence"].insert(0, f"over the last {len(records)} requests kept ({added} since start)")
                explained_at, explained_added = now, added
            out.append(_event("state", state))
            next_state = now + STATE_EVERY_S
        if out:
            async with asyncio.timeout(STALLED_S):
                await stream.write(b"".join(out))
        await _until_change(records, closing, added, judged, next_state - time.monotonic())
        await asyncio.sleep(BATCH_S)  # what finishes meanwhile goes out in the same write


async def _until_change(
    records: RecentRecords, closing: dict[str, int], added: int, judged: int, timeout_s: float
) -> None:
    """Until a request finishes or a suggestion is judged after those seen, the app closes, or `timeout_s`."""
    with contextlib.suppress(TimeoutError):
        await records.changes.wait_for(
            lambda: bool(closing["closing"]) or records.added != added or records.judged_count != judged,
            max(0.0, timeout_s),
        )


async def other_traffic(app: web.Application) -> None:
    """While completions end at the deadline (the warning is current), ask the serving upstream how many requests
    it holds: more than the proxy has running there (its completions not dropped, its chats) is other programs'
    work, or dropped ones the server still finishes, and the warning says so."""
    watch = app[TELEMETRY].deadline_watch
    if watch is None or watch.current() is None or UPSTREAMS not in app or SERVICE not in app:
        return
    held = await app[UPSTREAMS].client.held()
    flights, admission = app[SERVICE].flights, app[POLICIES].admission
    running = flights.sent_upstream - flights.letting_go + admission.bulk_running
    watch.others = max(0, held - running) if held is not None else 0


def _state(app: web.Application) -> dict[str, Any]:
    state = status_body(app)
    watch = app[TELEMETRY].deadline_watch
    state["warning"] = watch.current() if watch is not None else None
    state["at"] = time.time()
    return state
