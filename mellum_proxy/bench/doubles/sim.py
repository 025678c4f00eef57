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
from collections.abc import Callable
from pathlib import Path

import orjson
from aiohttp import web

from mellum_proxy.bench.doubles.responder import Responder, answering, routes
from mellum_proxy.bench.doubles.sim_engine import SimEngine, SimProfile, SimRefused

__all__ = ["PROFILES", "SimProfile", "SimServer", "junk_text", "profile"]

PROFILES = {
    "embedded-cpu": SimProfile(
        "embedded-cpu", prefill_tps=350, decode_tps=60, slots=2, kv_tokens=4096, chars_per_token=3.3,
        batch_penalty=0.9, overhead_ms=8,
        source="calibrated against the embedded llama.cpp server on this project's 2-core machine (gemma-3-270m "
               "Q4_K_M, 2 slots): docs/measurements/runs/calibration",
    ),
    "gpu": SimProfile(
        "gpu", prefill_tps=15_000, decode_tps=150, slots=4, kv_tokens=1 << 16, chars_per_token=3.3,
        batch_penalty=0.05, overhead_ms=5,
        source="GPU-like, derived (not measured): Mellum-4b Q8_0 on an RTX 4090 class card. Prefill from "
               "llama.cpp's published RTX 4090 figure for llama 8B Q4_0 (pp512 10,359 t/s, ggml-org/llama.cpp "
               "PR #7676) scaled to 4B parameters; decode from 1 TB/s over 4.3 GB of weights at ~65 % efficiency",
    ),
    "mac-m4": SimProfile(
        "mac-m4", prefill_tps=450, decode_tps=24, slots=1, kv_tokens=8192, chars_per_token=3.3,
        batch_penalty=0.9, overhead_ms=10,
        source="Apple-silicon-like, derived (not measured): Mellum-4b Q8_0 on a base M4 (Mac mini, 120 GB/s). From a "
               "published llama.cpp Metal run of llama 3.1 8B Q4_K_M on a Mac mini M4 (pp512 224.81 t/s, tg128 20.87 "
               "t/s, brand-o/normiebench issue #3): prefill scaled by parameters (8B -> 4B), decode by weight bytes "
               "(4.9 -> 4.3 GB); one slot, as on a laptop",
    ),
    "h100": SimProfile(
        "h100", prefill_tps=12_400, decode_tps=119, slots=4, kv_tokens=1 << 16, chars_per_token=3.3,
        batch_penalty=0.05, overhead_ms=5,
        source="H100-like, derived (not measured): Mellum-4b Q8_0 on an H100 PCIe 80GB under llama.cpp. From the "
               "published llama.cpp runs in XiongjieDai/GPU-Benchmarks-on-LLM-Inference (README, Dec 2023 "
               "snapshot): llama 7B F16 prompt 7,367 t/s scaled by parameters (6.74B -> 4B), llama 7B Q4_0 "
               "generation 133.77 t/s scaled by weight bytes (3.82 -> 4.3 GB). The same table gives the RTX 4090 "
               "7,349 and 149.37: under llama.cpp an H100 is not faster per request than a 4090",
    ),
    "laptop-m3": SimProfile(
        "laptop-m3", prefill_tps=311, decode_tps=18.8, slots=1, kv_tokens=8192, chars_per_token=3.3,
        batch_penalty=0.9, overhead_ms=10,
        source="laptop-GPU-like, derived (not measured): Mellum-4b Q8_0 on a 14-inch MacBook Pro M3 (10-core GPU). "
               "From the published llama.cpp run in XiongjieDai/GPU-Benchmarks-on-LLM-Inference (README, llama 2 7B "
               "Q4_0: prompt 184.51 t/s, generation 20.79 t/s): prefill scaled by parameters (6.74B -> 4B), decode "
               "by weight bytes (3.89 -> 4.3 GB); one slot",
    ),
    "fast": SimProfile(
        "fast", prefill_tps=50_000, decode_tps=2_000, slots=2, kv_tokens=1 << 20, chars_per_token=3.3,
        batch_penalty=0.0, source="synthetic: fast enough for tests, same shape",
    ),
}  # fmt: skip

Writer = Callable[[str, str], str]  # (prompt, suffix) -> what the model writes


def profile(name: str) -> SimProfile:
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
        return SimProfile(**{key: data[key] for key in SimProfile.__dataclass_fields__ if key in data})
    except (OSError, orjson.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{name}: not a profile written by `mellum-proxy profile` ({exc})") from exc


def junk_text(prompt: str, suffix: str = "") -> str:
    """4-43 tokens of "tok", the same for the same prompt."""
    natural = 4 + int(hashlib.sha256((prompt + suffix).encode()).hexdigest()[:4], 16) % 40
    return "tok" + " tok" * (natural - 1)


class SimServer:
    def __init__(self, spec: SimProfile, writer: Writer = junk_text) -> None:
        self.spec = spec
        self.engine = SimEngine(spec)
        self.writer = writer

    def app(self) -> web.Application:
        models = {"object": "list", "data": [{"id": f"sim-{self.spec.name}", "object": "model"}]}
        props = {"total_slots": self.spec.slots}
        return routes({"POST /v1/completions": self._completions, "GET /props": answering(props),
                       "GET /health": answering({"status": "ok"}), "GET /v1/models": answering(models),
                       "GET /metrics": self._metrics})  # fmt: skip

    async def _metrics(self, request: web.Request) -> web.Response:
        engine = self.engine
        lines = [
            f"llamacpp:prompt_tokens_total {engine.prompt_tokens}",
            f"llamacpp:tokens_predicted_total {engine.tokens_predicted}",
            f"llamacpp:requests_processing {engine.active}",
            f"llamacpp:requests_deferred {engine.deferred}",
        ]
        return web.Response(text="\n".join(lines) + "\n")

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
