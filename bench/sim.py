"""A simulated OpenAI-compatible completion server, for machines without a model.

The latency model: prompts are `chars_per_token` characters a token; the prompt is prefilled at
`prefill_tps` less what a recent prompt shares with it (a prompt cache), then tokens are decoded at
`decode_tps`. Both slow down by `batch_penalty` for each other sequence running at once. `slots`
sequences run at once, others wait in a FIFO queue; a request whose tokens would overflow the
`kv_tokens` capacity is refused with 503 as an out-of-memory would be. A client that disconnects stops
its sequence. `/metrics` uses llama.cpp's names, so the bench reads sim and real servers the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import deque
from dataclasses import dataclass

from aiohttp import web

from proxy.dialects.openai import DONE, sse, text_completion


@dataclass(frozen=True, slots=True)
class SimProfile:
    name: str
    prefill_tps: float
    decode_tps: float
    slots: int
    kv_tokens: int
    chars_per_token: float
    batch_penalty: float
    source: str


PROFILES = {
    "embedded-cpu": SimProfile(
        "embedded-cpu", prefill_tps=350, decode_tps=60, slots=2, kv_tokens=4096, chars_per_token=3.3,
        batch_penalty=0.9,
        source="measured on this project's 2-core machine against the embedded llama.cpp server (gemma-3-270m "
               "Q4_K_M, 2 slots): 336-406 tok/s prefill, 53-64 tok/s decode, 3.3 characters a token on bench/code",
    ),
    "fast": SimProfile(
        "fast", prefill_tps=50_000, decode_tps=2_000, slots=2, kv_tokens=1 << 20, chars_per_token=3.3,
        batch_penalty=0.0, source="synthetic: fast enough for tests, same shape",
    ),
}  # fmt: skip


def profile(name: str) -> SimProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown sim profile '{name}' (known: {', '.join(PROFILES)})")
    return PROFILES[name]


class SimServer:
    def __init__(self, spec: SimProfile) -> None:
        self.spec = spec
        self._slots = asyncio.Semaphore(spec.slots)
        self.active = 0
        self.deferred = 0
        self.kv_in_use = 0
        self.tokens_predicted = 0
        self.prompt_tokens = 0
        self.requests = 0
        self.refused = 0
        self._recent: deque[str] = deque(maxlen=8)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/props", self._props)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response({"total_slots": self.spec.slots})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": f"sim-{self.spec.name}", "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = [
            f"llamacpp:prompt_tokens_total {self.prompt_tokens}",
            f"llamacpp:tokens_predicted_total {self.tokens_predicted}",
            f"llamacpp:requests_processing {self.active}",
            f"llamacpp:requests_deferred {self.deferred}",
        ]
        return web.Response(text="\n".join(lines) + "\n")

    def _tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.spec.chars_per_token)

    def _cached(self, prompt: str) -> int:
        best = 0
        for old in self._recent:
            n = 0
            for a, b in zip(old, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return math.floor(best / self.spec.chars_per_token)

    def _slowdown(self) -> float:
        return 1 + self.spec.batch_penalty * max(0, self.active - 1)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = str(body.get("prompt", "")) + str(body.get("suffix") or "")
        max_tokens = int(body.get("max_tokens") or 16)
        stream = bool(body.get("stream"))
        self.requests += 1
        prompt_tokens = self._tokens(prompt)
        if self.kv_in_use + prompt_tokens + max_tokens > self.spec.kv_tokens:
            self.refused += 1
            error = {"message": "out of memory: the KV cache is full", "type": "server_error"}
            return web.json_response({"error": error}, status=503)
        self.kv_in_use += prompt_tokens + max_tokens
        try:
            self.deferred += 1
            try:
                await self._slots.acquire()  # FIFO: the server's own queue
            finally:
                self.deferred -= 1
            self.active += 1
            try:
                return await self._generate(request, prompt, prompt_tokens, max_tokens, stream)
            finally:
                self.active -= 1
                self._slots.release()
        finally:
            self.kv_in_use -= prompt_tokens + max_tokens

    async def _generate(self, request: web.Request, prompt: str, prompt_tokens: int, max_tokens: int,
                        stream: bool) -> web.StreamResponse:  # fmt: skip
        cached = min(self._cached(prompt), prompt_tokens)
        computed = prompt_tokens - cached
        await asyncio.sleep(computed / self.spec.prefill_tps * self._slowdown())  # the simulated prefill
        self.prompt_tokens += computed
        self._recent.append(prompt)
        # a deterministic natural length: some completions end before max_tokens, as with EOS
        natural = 4 + int(hashlib.sha256(prompt.encode()).hexdigest()[:4], 16) % 40
        count = min(max_tokens, natural)
        ident, created = f"sim-{self.requests}", int(time.time())
        response = None
        if stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
        text = ""
        for i in range(count):
            await asyncio.sleep(self._slowdown() / self.spec.decode_tps)  # the simulated decode step
            self.tokens_predicted += 1
            piece = " tok" if i else "tok"
            text += piece
            if response is not None:
                await response.write(sse(text_completion(ident, created, "sim", piece, None)))
        finish = "length" if count == max_tokens else "stop"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count, "total_tokens": prompt_tokens + count,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        if response is None:
            return web.json_response(text_completion(ident, created, "sim", text, finish, usage))
        await response.write(sse(text_completion(ident, created, "sim", "", finish, usage)))
        await response.write(DONE)
        await response.write_eof()
        return response
