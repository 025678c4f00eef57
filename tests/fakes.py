"""The suite's stand-ins, in one place: servers built from the real one's source (cited at the class), an
upstream and an answer for the completion core, and a GPU. The bench's own doubles (`benchmarks/doubles/`:
the scripted and the faulty OpenAI server, the simulator) serve the tests too."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.errors import ProxyError
from mellum_proxy.models import Batches, BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from mellum_proxy.telemetry import GpuReading


class MemoryUpstream:
    """Streams one `x` per max_tokens, 1 ms apart (virtual), and counts streams open at once."""

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self.opened = 0
        self.closed = 0

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
        self.opened += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for _ in range(prompt.max_tokens):
                await asyncio.sleep(0.001)
                yield [Chunk(text="x")]
            yield [Chunk(text="", finish_reason="length")]
        finally:
            self.active -= 1
            self.closed += 1


@dataclass
class RecordingAnswer:
    """Keeps every call the service makes: ("finish", outcome, text) or ("fail", message)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    sent: str = ""

    async def send(self, completion: Completion, chunks: Sequence[Chunk]) -> None:
        self.sent += "".join(chunk.text for chunk in chunks)

    async def finish(self, completion: Completion, outcome: Outcome) -> None:
        self.calls.append(("finish", outcome, completion.text))

    async def fail(self, completion: Completion, error: ProxyError) -> None:
        self.calls.append(("fail", str(error)))


class FakeGpu:
    """A GPU backend whose memory the test sets; `fail` makes the next read raise like a broken driver."""

    def __init__(self, used_mib: float = 1000, total_mib: float = 24576) -> None:
        self.used_mib = used_mib
        self.total_mib = total_mib
        self.fail = False
        self.closed = False

    def read(self) -> Any:
        if self.fail:
            raise RuntimeError("GPU is lost")
        return GpuReading(int(self.used_mib * 1024 * 1024), int(self.total_mib * 1024 * 1024), None)

    def close(self) -> None:
        self.closed = True


class CountingVllm:
    """A vLLM-shaped upstream whose tokenizer makes one token of every character (dense text: minified code,
    CJK, emoji), with vLLM's own rules (vllm/entrypoints/openai): `/tokenize` takes `prompt` (400 otherwise)
    and answers `tokens` (ids), `count` and `max_model_len`, with `token_strs` only when asked and
    `token_strs=True` here; `/v1/models` lists one model with `max_model_len`; a prompt whose tokens and
    `max_tokens` exceed it is refused with serving_engine.py's 400 before anything streams.

    Attributes:
        tokenize_calls: how many times `/tokenize` was asked.
        prompt_tokens: each completion's prompt as this server counts it (refused ones too).
        refused: completions refused as over the context.
    """

    model = "JetBrains/Mellum-4b-base"

    def __init__(self, max_model_len: int = 1024, token_strs: bool = False, undercount: int = 1) -> None:
        self.max_model_len = max_model_len
        self.token_strs = token_strs
        self.undercount = undercount  # /tokenize counts one token per this many characters (1: the truth)
        self.fake = FakeUpstream(tokens=3)
        self.fake.count_prompt = self.count
        self.tokenize_calls = 0
        self.prompt_tokens: list[int] = []
        self.refused = 0

    def count(self, text: str, special: bool = True) -> int:
        return len(text) + (1 if special else 0)  # BOS

    def app(self) -> web.Application:
        app = self.fake.app()

        @web.middleware
        async def context_check(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path == "/props":
                raise web.HTTPNotFound()
            if request.path == "/v1/completions":
                body = await request.json()
                prompt = self.count(str(body.get("prompt", "")))
                self.prompt_tokens.append(prompt)
                asked = int(body.get("max_tokens") or 16)
                if prompt + asked > self.max_model_len:
                    self.refused += 1
                    message = (f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                               f"requested {prompt + asked} tokens ({prompt} in the messages, {asked} in the "
                               "completion). Please reduce the length of the messages or completion.")  # fmt: skip
                    return web.json_response({"object": "error", "message": message, "type": "BadRequestError",
                                              "param": None, "code": 400}, status=400)  # fmt: skip
            answered: web.StreamResponse = await handler(request)
            return answered

        async def models(request: web.Request) -> web.Response:
            entry = {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}
            return web.json_response({"object": "list", "data": [entry]})

        async def tokenize(request: web.Request) -> web.Response:
            self.tokenize_calls += 1
            body = await request.json()
            if "prompt" not in body:
                return web.json_response({"object": "error", "message": "Field required: prompt",
                                          "type": "BadRequestError", "code": 400}, status=400)  # fmt: skip
            text = str(body["prompt"])
            special = bool(body.get("add_special_tokens", True))
            count = self.count(text, special) // self.undercount
            answer: dict[str, Any] = {"count": count, "max_model_len": self.max_model_len, "tokens": list(range(count))}
            if self.token_strs and body.get("return_token_strs"):
                answer["token_strs"] = (["<s>"] if special else []) + [_byte_level(ch) for ch in text]
            return web.json_response(answer)

        app.middlewares.append(context_check)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/tokenize", tokenize)
        return app


def _byte_level(char: str) -> str:
    """How a byte-level BPE vocabulary writes a one-character token (`Ġ` for a space, `Ċ` for a newline)."""
    from mellum_proxy.budget.tokenizers import _byte_level_alphabet

    shown = {byte: ch for ch, byte in _byte_level_alphabet().items()}
    return "".join(shown[byte] for byte in char.encode())
