"""A simulated OpenAI-compatible completion server over HTTP, for machines without a model.

The server's behaviour is `bench.sim_engine.SimEngine` (llama.cpp's slots, FIFO queue,
uninterruptible prefill, prompt cache); this module only speaks HTTP for it. A client that
disconnects is marked gone: its task stops at the next decoded token, or is dropped when a slot
takes it from the queue, as llama.cpp does. `/metrics` uses llama.cpp's names, so the bench reads
sim and real servers the same way. What the "model" writes comes from `writer` (default: a
deterministic junk text of a natural length, some ending before `max_tokens` as with EOS).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from mellum_proxy.tuning.sim.engine import SimEngine, SimRefused
from mellum_proxy.tuning.sim.responder import Responder, answering, routes
from mellum_proxy.tuning.sim.server_profile import ServerProfile

__all__ = ["PROFILES", "ServerProfile", "SimServer", "junk_text", "profile"]

# The lab's servers, in the format `mellum-proxy profile --out` writes: one calibrated against the embedded
# server, four derived from published llama.cpp runs (each `source` says which), and a fast one for tests.
PROFILES = {name: ServerProfile(**fields) for name, fields in orjson.loads(
    files("mellum_proxy.tuning.sim").joinpath("profiles.json").read_bytes()).items()}  # fmt: skip

Writer = Callable[[str, str], str]  # (prompt, suffix) -> what the model writes
CHAT_TOKENS = 600  # a chat answer's length when the client names none (4 s at 150 tokens/s)


def profile(name: str) -> ServerProfile:
    """A named profile, or one measured by `mellum-proxy profile` (a path to its JSON).

    Raises:
        ValueError: neither a known name nor a readable profile file.
    """
    if name in PROFILES:
        return PROFILES[name]
    if not name.endswith(".json"):
        raise ValueError(f"unknown sim profile '{name}' (known: {', '.join(PROFILES)}, or a profile.json)")
    try:
        data = orjson.loads(Path(name).read_bytes())
        return ServerProfile(**{key: data[key] for key in ServerProfile.__dataclass_fields__ if key in data})
    except (OSError, orjson.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{name}: not a profile written by `mellum-proxy profile` ({exc})") from exc


def junk_text(prompt: str, suffix: str = "") -> str:
    """4-43 tokens of "tok", the same for the same prompt."""
    natural = 4 + int(hashlib.sha256((prompt + suffix).encode()).hexdigest()[:4], 16) % 40
    return "tok" + " tok" * (natural - 1)


class SimServer:
    def __init__(self, spec: ServerProfile, writer: Writer = junk_text) -> None:
        self.spec = spec
        self.engine = SimEngine(spec)
        self.writer = writer

    def app(self) -> web.Application:
        models = {"object": "list", "data": [{"id": f"sim-{self.spec.name}", "object": "model"}]}
        props = {"total_slots": self.spec.slots}
        return routes({"POST /v1/completions": self._completions, "POST /v1/chat/completions": self._chat,
                       "GET /props": answering(props),
                       "GET /health": answering({"status": "ok"}), "GET /v1/models": answering(models),
                       "GET /metrics": self._metrics})  # fmt: skip

    async def _metrics(self, request: web.Request) -> web.Response:
        engine = self.engine
        engine.metrics_read()
        lines = [
            f"llamacpp:prompt_tokens_total {engine.prompt_tokens}",
            f"llamacpp:tokens_predicted_total {engine.tokens_predicted}",
            f"llamacpp:tokens_predicted_seconds_total {engine.decode_seconds}",
            f"llamacpp:requests_processing {engine.active}",
            f"llamacpp:requests_deferred {engine.deferred}",
        ]
        return web.Response(text="\n".join(lines) + "\n")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """A chat answer: the messages are its prompt, and it writes `max_tokens` tokens (a chat or an agent's
        long answer), in the OpenAI chat-completion shape; a slot of the same engine as the completions'."""
        body = await request.json()
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        max_tokens = int(body.get("max_tokens") or CHAT_TOKENS)
        task = self.engine.submit(prompt, max_tokens, "tok" + " tok" * (max_tokens - 1), True)
        ident, created = f"chat-{self.engine.requests}", int(time.time())

        def chunk(content: str | None, finish: str | None = None) -> dict[str, Any]:
            delta = {} if content is None else {"content": content}
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": "sim",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            async for batch in task.stream():
                await response.write(b"".join(b"data: " + orjson.dumps(chunk(piece)) + b"\n\n" for piece in batch))
            await response.write(b"data: " + orjson.dumps(chunk(None, task.finish_reason)) + b"\n\ndata: [DONE]\n\n")
            await response.write_eof()
        except asyncio.CancelledError:
            task.leave()
            raise
        except ConnectionResetError:
            task.leave()
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt, suffix = str(body.get("prompt", "")), str(body.get("suffix") or "")
        max_tokens = int(body.get("max_tokens") or 16)
        try:
            task = self.engine.submit(
                prompt + suffix, max_tokens, self.writer(prompt, suffix), bool(body.get("stream"))
            )
        except SimRefused as exc:  # as llama.cpp answers it
            error = {"code": 400, "message": str(exc), "type": "exceed_context_size_error",
                     "n_prompt_tokens": exc.prompt_tokens, "n_ctx": exc.slot_tokens}  # fmt: skip
            return web.json_response({"error": error}, status=400)
        answer = Responder(request, body, f"sim-{self.engine.requests}", "sim")
        try:
            await answer.start()
            async for batch in task.stream():
                await answer.write(*batch)
            count = task.completion_tokens
            usage = {"prompt_tokens": task.prompt_tokens, "completion_tokens": count,
                     "total_tokens": task.prompt_tokens + count,
                     "prompt_tokens_details": {"cached_tokens": task.cached_tokens}}  # fmt: skip
            return await answer.finish(task.finish_reason, usage)
        except asyncio.CancelledError:
            task.leave()
            raise
        except ConnectionResetError:  # the client left (the proxy cancelled it): stop, as llama.cpp does, quietly
            task.leave()
            return answer.response or web.Response(status=499)
