"""`mellum-proxy profile --upstream URL --out FILE.json`: measure a completion server in a minute or two, for
the policy lab (`bench lab --profile FILE.json`) and for a person choosing settings.

Over `/v1/completions`, streamed, at temperature 0:
- time to first token against prompt length, each prompt cold (a new prompt: a nonce first) and again at
  once (the server's prompt cache); the per-request overhead a cached request's first token less one decode
  step, a fixed part and a part growing with the prompt (the line through the cached times), the prefill rate
  the slope of the cold times less that part;
- the decode rate of one request, from its token events' arrival (`ignore_eos`, so it runs to `max_tokens`),
  the median over a long request and the repeats below;
- a plugin's request as typing sends it, in pairs: the same short request after a keystroke's gap of quiet
  (`TYPING_GAP_S`), then at once again, `PAIRS` times (fewer on a slow server); how much slower the server
  answers after the quiet (`idle_slowdown`, the median of the pairs' ratios: on a VM or a GPU that clocks down,
  a request after a pause is slower than one of a busy stream) and how much one such request's time varies
  (`spread`, the standard deviation of the logarithm of the quiet ones' times, read robustly from the slow
  side: how far their upper quartile lies above their median, over 0.6745); the lab's simulator takes both.
  Pairs, not two blocks: a machine's slow moment then slows both of a pair, not one block of the two (five
  profiles in a row, measured in blocks, gave 1.08-1.78x);
- concurrency: the per-request decode rate with 1..N requests at once (N: the server's slots), and from it
  how much each other running sequence slows one down (`batch_penalty`, as the lab's simulator takes it);
- whether a client's disconnect stops decoding, and whether it stops a prefill, from the server's own
  token counters (llama.cpp's or vLLM's `/metrics`; null when it has none).
The prompts are this package's own Python source: real code, shipped with it.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import statistics
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from mellum_proxy.tuning.sim.server_profile import ServerProfile
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.servers import discover

LENGTHS = (128, 512, 1024, 2048, 4096)  # prompt tokens asked for, up to half the server's context
DECODE_TOKENS = 64
CONCURRENT_TOKENS = 32
PAIRS, REPEAT_TOKENS = 24, 16  # a completion plugin's request, after a quiet and at once again
TYPING_GAP_S = 0.15  # between keystrokes: the shipped traces' median gap is 136 ms
PAIR_BUDGET_S, FEWEST_PAIRS = 8.0, 5  # a slow server is asked fewer times: at least 5, until 8 s are spent
UPPER_QUARTILE_Z = 0.6745  # how many standard deviations a normal distribution's upper quartile lies above its median
# counters of tokens the server computed (prompt) and decoded, by server
PROMPT_COUNTERS = ("llamacpp:prompt_tokens_total", "vllm:prompt_tokens_total")
DECODE_COUNTERS = ("llamacpp:tokens_predicted_total", "vllm:generation_tokens_total")
BUSY_GAUGES = ("llamacpp:requests_processing", "llamacpp:requests_deferred", "vllm:num_requests_running",
               "vllm:num_requests_waiting")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Profile(ServerProfile):
    """A `ServerProfile` (what `bench lab --profile` reads) and what was measured to make it."""

    fit_intercept_ms: float = 0.0  # the cold times' intercept: the overhead plus what the fit could not place
    kind: str | None = None
    model: str | None = None
    context_tokens: int | None = None
    ttft: list[dict[str, float]] = field(default_factory=list)  # prompt tokens, cold and cached ms
    concurrency: list[dict[str, float]] = field(default_factory=list)  # at once, per-request and total tok/s
    repeat_ms: list[float] = field(default_factory=list)  # the same request, each at once after a quiet one
    spaced_ms: list[float] = field(default_factory=list)  # the same, each after `TYPING_GAP_S` of quiet
    disconnect_stops_decode: bool | None = None
    disconnect_stops_prefill: bool | None = None
    took_s: float = 0.0
    draft_acceptance: float | None = None  # the server speculates: what its long decodes drafted, accepted
    speculation: dict[str, Any] | None = None  # the embedded server again with self-speculation, for comparison

    def as_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)


@dataclass
class Timed:
    ttft_s: float
    total_s: float
    token_times: list[float]
    prompt_tokens: int | None
    drafted: int = 0  # the server's speculation (its final timings' `draft_n`), and what was accepted
    accepted: int = 0


def code_text() -> str:
    """This package's own source, as one long text of real code."""
    files = [p for p in resources.files("mellum_proxy").iterdir() if p.name.endswith(".py")]
    return "\n".join(p.read_text() for p in sorted(files, key=lambda p: p.name))


class Prober:
    def __init__(self, session: aiohttp.ClientSession, url: str, model: str | None) -> None:
        self.session, self.url, self.model = session, url.rstrip("/"), model

    async def complete(self, prompt: str, max_tokens: int, leave_after: int | None = None) -> Timed:
        """One streamed completion; with `leave_after`, the connection is closed after that many token events
        (0: before the first)."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                                "ignore_eos": True, "cache_prompt": True,
                                "stream_options": {"include_usage": True}}  # fmt: skip
        if self.model:
            body["model"] = self.model
        started = time.perf_counter()
        times: list[float] = []
        prompt_tokens = None
        drafted = accepted = 0
        async with self.session.post(self.url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise ProfileError(f"/v1/completions answered {resp.status}: {(await resp.text())[:200]}")
            if leave_after == 0:
                return Timed(0.0, 0.0, [], None)
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                event = orjson.loads(line[6:])
                if any(choice.get("text") for choice in event.get("choices") or []):
                    times.append(time.perf_counter() - started)
                    if leave_after is not None and len(times) >= leave_after:
                        break
                usage, timings = event.get("usage"), event.get("timings")
                if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                    prompt_tokens = usage["prompt_tokens"]
                if isinstance(timings, dict) and type(timings.get("draft_n")) is int:
                    drafted, accepted = timings["draft_n"], int(timings.get("draft_n_accepted") or 0)
        total = time.perf_counter() - started
        return Timed(times[0] if times else total, total, times, prompt_tokens, drafted, accepted)

    async def counters(self) -> dict[str, float]:
        try:
            async with self.session.get(self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                text = await resp.text() if resp.status == 200 else ""
            return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return {}

    async def idle(self, timeout_s: float = 60.0) -> None:
        """Until the server says it runs and queues nothing (at once when it cannot say)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = [v for k, v in (await self.counters()).items() if k in BUSY_GAUGES]
            if not busy or sum(busy) == 0:
                return
            await asyncio.sleep(0.05)  # the server's own gauges: there is no event to wait on


class ProfileError(Exception):
    """The server could not be profiled (it refused a completion, or is not a completion server)."""


def _counter(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((values[name] for name in names if name in values), None)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return mean_y - slope * mean_x, slope


def _overhead(ttft: list[dict[str, float]], decode_tps: float) -> tuple[float, float]:
    """What a request costs besides its prefill, from the prompt-cached first tokens less one decode step: a
    fixed part (ms) and a part for each prompt token (ms a token: tokenizing, the cache's lookup), fitted."""
    step_ms = 1000 / decode_tps if decode_tps else 0.0
    points = [(row["prompt_tokens"], row["cached_ms"]) for row in ttft]
    if len(points) < 2:
        return max(0.0, (points[0][1] if points else 0.0) - step_ms), 0.0
    fixed, per_token = _fit(points)
    if per_token <= 0:  # no growth seen: all of it fixed
        return max(0.0, statistics.median(ms for _, ms in points) - step_ms), 0.0
    return max(0.0, fixed - step_ms), per_token


def spread(times_ms: list[float]) -> float:
    """How much one request's time varies: the standard deviation of the logarithm of its times, read from how far
    their upper quartile lies above their median. The slow side, which a p95 sees: this machine's times are skewed
    towards it, and the median absolute deviation (both sides) left the lab's p95 under the real one. A few requests
    caught in a slow moment move it by the share of the requests they are, not by how slow; 0 with fewer than two."""
    logs = [math.log(t) for t in times_ms if t > 0]
    if len(logs) < 2:
        return 0.0
    _, middle, upper = statistics.quantiles(logs, n=4, method="inclusive")
    return (upper - middle) / UPPER_QUARTILE_Z


async def _pairs(probe: Prober) -> tuple[list[Timed], list[Timed]]:
    """The same short request after `TYPING_GAP_S` of quiet, then at once again: `PAIRS` times, or as many as
    `PAIR_BUDGET_S` allows (at least `FEWEST_PAIRS`). The quiet ones, and the ones at once."""
    spaced: list[Timed] = []
    again: list[Timed] = []
    spent = 0.0
    while len(spaced) < PAIRS and (spent < PAIR_BUDGET_S or len(spaced) < FEWEST_PAIRS):
        await asyncio.sleep(TYPING_GAP_S)  # the quiet being measured, not a wait for anything
        spaced.append(await probe.complete("def again():\n    ", REPEAT_TOKENS))
        again.append(await probe.complete("def again():\n    ", REPEAT_TOKENS))
        spent += TYPING_GAP_S + spaced[-1].total_s + again[-1].total_s
    return spaced, again


def _decode_rate(times: list[float]) -> float | None:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 2 and times[-1] > times[0] else None


async def profile(url: str, name: str | None = None, progress: Any = None, shown_as: str | None = None) -> Profile:
    """Measure the server at `url` (see the module docstring); `shown_as`: how the source names it."""
    started = time.monotonic()
    say = progress or (lambda _text: None)
    # a fresh connection each request: llama.cpp closes one after a streamed answer, and a request sent on it
    # before the close is seen would fail
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        found = await discover(UpstreamClient(session, url))
        probe = Prober(session, url, found.model)
        context = found.context or 2048
        slots = found.slots or 1
        code = code_text()
        say(f"{found.kind or 'server'} {found.model or ''}: {context} tokens a request, {slots} slots")
        await probe.complete("def warm_up():\n    return ", 2)
        ttft, cold_points, chars_per_token = [], [], []
        for length in (n for n in LENGTHS if n <= context // 2):
            prompt = f"# {secrets.token_hex(8)}\n" + code[: length * 3]
            cold = await probe.complete(prompt, 1)
            cached = await probe.complete(prompt, 1)
            tokens = cold.prompt_tokens or length
            chars_per_token.append(len(prompt) / tokens)
            cold_points.append((float(tokens), cold.ttft_s))
            cold_ms, cached_ms = cold.ttft_s * 1000, cached.ttft_s * 1000
            ttft.append({"prompt_tokens": tokens, "cold_ms": cold_ms, "cached_ms": cached_ms})
            say(f"prompt {tokens} tokens: first token {cold_ms:.0f} ms cold, {cached_ms:.0f} ms cached")
        intercept, slope = _fit(cold_points) if len(cold_points) > 1 else (0.0, cold_points[0][1] / cold_points[0][0])
        long = await probe.complete("def count():\n    ", DECODE_TOKENS)
        spaced, repeats = await _pairs(probe)
        rates = [r for r in (_decode_rate(run.token_times) for run in [long, *repeats]) if r]
        decode = statistics.median(rates) if rates else 0.0
        repeat_ms = [run.total_s * 1000 for run in repeats]
        spaced_ms = [run.total_s * 1000 for run in spaced]
        slowdown = max(1.0, statistics.median(s / r for s, r in zip(spaced_ms, repeat_ms, strict=True) if r > 0))
        overhead_ms, per_token_ms = _overhead(ttft, decode)
        prefill_s = slope - per_token_ms / 1000  # a cold token's cost less what a cached one costs too
        prefill = 1 / prefill_s if prefill_s > 0 else 1 / slope if slope > 0 else 0.0
        say(
            f"prefill {prefill:.0f} tok/s, decode {decode:.1f} tok/s; the same request in {len(repeat_ms)} pairs: "
            f"{statistics.median(spaced_ms):.0f} ms median after {TYPING_GAP_S * 1000:.0f} ms of quiet, "
            f"{statistics.median(repeat_ms):.0f} ms at once after it ({slowdown:.2f}x)"
        )
        concurrency = []
        for together in range(1, slots + 1):
            runs = await asyncio.gather(*(probe.complete(f"# {i}\ndef f{i}():\n    ", CONCURRENT_TOKENS)
                                          for i in range(together)))  # fmt: skip
            rates = [r for r in (_decode_rate(run.token_times) for run in runs) if r]
            each = statistics.fmean(rates) if rates else 0.0
            concurrency.append({"at_once": together, "decode_tps_each": each, "decode_tps_total": each * together})
            say(f"{together} at once: {each:.1f} tok/s each")
        penalty = 0.0
        if len(concurrency) > 1 and concurrency[-1]["decode_tps_each"] > 0:
            first, last = concurrency[0]["decode_tps_each"], concurrency[-1]
            penalty = max(0.0, (first / last["decode_tps_each"] - 1) / (last["at_once"] - 1))
        stops_decode, stops_prefill = await _disconnects(probe, code, context)
        drafted, accepted = sum(run.drafted for run in [long, *repeats]), sum(run.accepted for run in [long, *repeats])
        if drafted:
            say(f"the server speculates: {accepted} of {drafted} drafted tokens accepted")
    return Profile(
        name=name or f"{found.kind or 'server'}:{found.model or url}",
        prefill_tps=prefill, decode_tps=decode, slots=slots, kv_tokens=context * slots,
        chars_per_token=statistics.fmean(chars_per_token), batch_penalty=penalty,
        overhead_ms=overhead_ms, overhead_per_token_ms=per_token_ms, fit_intercept_ms=intercept * 1000,
        spread=spread(spaced_ms), idle_slowdown=slowdown, repeat_ms=repeat_ms, spaced_ms=spaced_ms,
        source=f"measured by `mellum-proxy profile --upstream {shown_as or url}`",
        kind=found.kind, model=found.model, context_tokens=context, ttft=ttft, concurrency=concurrency,
        disconnect_stops_decode=stops_decode, disconnect_stops_prefill=stops_prefill,
        took_s=time.monotonic() - started, draft_acceptance=accepted / drafted if drafted else None,
    )  # fmt: skip


async def decode_with(url: str, spec: str, say: Any) -> dict[str, Any]:
    """The decode rate and draft acceptance of a server started with speculation `spec` (the same long decodes as
    `profile`'s), to set beside the profile's own."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        found = await discover(UpstreamClient(session, url))
        probe = Prober(session, url, found.model)
        runs = [await probe.complete("def count():\n    ", DECODE_TOKENS) for _ in range(3)]
    rates = [r for r in (_decode_rate(run.token_times) for run in runs) if r]
    drafted, accepted = sum(run.drafted for run in runs), sum(run.accepted for run in runs)
    result = {"spec": spec, "decode_tps": statistics.median(rates) if rates else None,
              "draft_acceptance": accepted / drafted if drafted else None, "drafted": drafted}  # fmt: skip
    say(f"with speculation {spec}: decode {result['decode_tps'] or 0:.1f} tok/s, {accepted} of {drafted} drafted "
        "tokens accepted")  # fmt: skip
    return result


async def _disconnects(probe: Prober, code: str, context: int) -> tuple[bool | None, bool | None]:
    """Whether a client that leaves stops the server decoding, and stops its prefill: from its counters."""
    before = await probe.counters()
    if _counter(before, DECODE_COUNTERS) is None:
        return None, None
    await probe.complete("def leave():\n    ", 128, leave_after=2)
    await probe.idle()
    after = await probe.counters()
    decoded = (_counter(after, DECODE_COUNTERS) or 0) - (_counter(before, DECODE_COUNTERS) or 0)
    stops_decode = decoded < 64  # it asked for 128
    length = min(2048, context // 2)
    prompt = f"# {secrets.token_hex(8)}\n" + code[: length * 3]
    before = await probe.counters()
    await probe.complete(prompt, 1, leave_after=0)  # gone once the answer's headers came
    await probe.idle()
    after = await probe.counters()
    computed = (_counter(after, PROMPT_COUNTERS) or 0) - (_counter(before, PROMPT_COUNTERS) or 0)
    return stops_decode, computed < length / 2
