"""`FakeUpstream`: a scripted OpenAI-compatible completion server for deterministic tests.

It streams `tokens` chunks per request with configurable delays, can hold every request at a gate
until the test opens it, reports a slot count on `/props`, and records what it saw: each payload,
how many requests ran at once, and how many clients disconnected before the end (a disconnect is
how the proxy tells a real server to stop decoding).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from mellum_proxy.tuning.sim.responder import Responder, routes


class FakeUpstream:
    def __init__(
        self,
        tokens: int = 4,
        token_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
        slots: int | None = 1,
        pieces: list[str] | None = None,
        stall_after: int | None = None,
        model: str | None = None,
        context: int | None = None,
    ) -> None:
        self.model = model  # listed on `/v1/models` when set (else no such route, as before)
        self.context = context  # `/props`' `default_generation_settings.n_ctx` when set
        self.tokens = tokens
        self.pieces = pieces  # the text of each token (default `t0 `, `t1 `, ...)
        self.stall_after = stall_after  # after this many tokens, stream nothing more until the client leaves
        self.count_prompt: Callable[[str], int] = lambda prompt: len(prompt) // 4  # the usage it reports
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.slots = slots
        self.gate: asyncio.Event | None = None  # an Event: requests wait for it before the first token
        self.payloads: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each completion request's headers
        self.fail_status: int | None = None  # when set, completions are answered with this status
        self.healthy = True  # `/health` answers 503 when False
        self.silent = False  # when True, completions are never answered (no status line), while `/health` is ok
        self.active = 0
        self.max_active = 0
        self.completed = 0
        self.disconnects = 0
        self.sent_tokens = 0
        self._changed = asyncio.Condition()
        self._closing = asyncio.Event()  # set as the server shuts down: a stalled answer ends then, not at a timeout

    def app(self) -> web.Application:
        handlers = {"POST /v1/completions": self._completions, "GET /props": self._props, "GET /health": self._health}
        if self.model is not None:
            handlers["GET /v1/models"] = self._models
        app = routes(handlers)
        app.on_shutdown.append(self._shut_down)
        return app

    async def _shut_down(self, app: web.Application) -> None:
        self._closing.set()

    async def wait_until(self, predicate: Any, timeout_s: float = 5.0) -> None:
        """Wait (event-driven) until `predicate(self)` holds; the timeout is only a safety net."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _props(self, request: web.Request) -> web.Response:
        if self.slots is None:
            raise web.HTTPNotFound()
        props: dict[str, Any] = {"total_slots": self.slots}
        if self.context is not None:
            props["default_generation_settings"] = {"n_ctx": self.context}
        return web.json_response(props)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        if not self.healthy:
            return web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503)
        return web.json_response({"status": "ok"})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.payloads.append(payload)
        self.headers.append(dict(request.headers))
        if self.fail_status is not None:
            await self._notify()
            return web.json_response({"error": {"message": "worker failed"}}, status=self.fail_status)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await self._notify()
        try:
            return await self._answer(request, payload)
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
        except ConnectionResetError:  # the proxy dropped the request: as a real server, no traceback
            self.disconnects += 1
            return web.Response(status=499)
        finally:
            self.active -= 1
            await self._notify()

    async def _answer(self, request: web.Request, payload: dict[str, Any]) -> web.StreamResponse:
        tokens = len(self.pieces) if self.pieces is not None else self.tokens
        asked = int(payload.get("max_tokens") or 0)
        n = min(tokens, asked or tokens)
        finish = "length" if asked and n >= asked else "stop"  # it ran to the cap, or ended on its own
        answer = Responder(request, payload, f"fake-{len(self.payloads)}", "fake")
        if self.silent:
            await self._closing.wait()  # the client gives up first
            return web.Response(status=503)  # read by no one: the server is shutting down
        await answer.start()  # the headers before the first token, as a real server sends them
        if self.first_token_delay_s:
            await asyncio.sleep(self.first_token_delay_s)
        if self.gate is not None:
            await self.gate.wait()
        for i in range(n):
            if i == self.stall_after:
                await self._closing.wait()  # a server that stalls mid-answer, until it shuts down
                return getattr(answer, "response", None) or web.Response(status=503)
            await answer.write(self.pieces[i] if self.pieces is not None else f"t{i} ")
            self.sent_tokens += 1
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
        prompt_tokens = self.count_prompt(str(payload.get("prompt", "")))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        self.completed += 1
        return await answer.finish(finish, usage)
