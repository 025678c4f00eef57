"""One candidate on the real server: started with its knobs, measured, stopped.

In order, as the guide takes them: the four readings (before start, loaded, idle, after the first request),
first-token time at a short and at a near-limit prompt with the candidate's batch at once, the decode rate, a
quality spot check, the peak memory, and what the server's own start-up log says it allocated. A candidate that
fails to start or fails under load is a result (its line quoted), not a crash.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from mellum_proxy.budget.tokenizers import CountingTokenizer, UpstreamTokenizer, upstream_counter
from mellum_proxy.errors import UpstreamError
from mellum_proxy.planning.candidates import Candidate
from mellum_proxy.planning.launch import OOM, LoadFailed, Running, start
from mellum_proxy.planning.logs import parse_log
from mellum_proxy.planning.memory import MemoryWatch
from mellum_proxy.planning.profile import Prober, ProfileError, code_text
from mellum_proxy.planning.quality import Quality, spot_check
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.servers import discover
from mellum_proxy.urls import free_port

GIB_IN_MIB = 1024
Counter = UpstreamTokenizer | CountingTokenizer
ASK_TOKENS = 8  # what each timed request decodes
DECODE_TOKENS = 32


@dataclass
class FitOptions:
    """How each candidate is run."""

    server_cmd: str | None = None  # None: the embedded llama.cpp
    threads: int = 1
    gpu: int = 0
    idle_s: float = 2.0
    load_timeout_s: float = 300.0
    request_timeout_s: float = 180.0
    quality: Quality | None = None


@dataclass
class Measurement:
    """What one candidate did on the server; every figure says what measured it (`memory_source`)."""

    candidate: Candidate
    status: str = "failed"  # ok | tight (over the headroom, under the target) | over | failed
    failures: list[dict[str, str]] = field(default_factory=list)
    readings: list[dict[str, Any]] = field(default_factory=list)
    memory_source: str = "host_rss"
    memory_note: str = ""
    measured_peak_gib: float | None = None
    budget_gib: float | None = None
    logged: dict[str, Any] = field(default_factory=dict)  # the server's own allocation lines, in bytes
    mismatches: list[str] = field(default_factory=list)
    ttft_ms: dict[str, float | None] = field(default_factory=lambda: {"short": None, "long": None})
    prompt_tokens: dict[str, int | None] = field(default_factory=lambda: {"short": None, "long": None})
    decode_tps: float | None = None
    quality: dict[str, Any] | None = None
    load_s: float | None = None
    took_s: float = 0.0
    log: str = ""  # the server's own output (kept beside the report, not in it)

    def fail(self, kind: str, detail: str) -> None:
        self.failures.append({"kind": kind, "detail": detail[:240]})

    def summary(self) -> dict[str, Any]:
        c = self.candidate
        return {"name": c.name, "model": c.model.name, "quant": c.quant, "context": c.context, "batch": c.batch,
                "kv_type": c.kv_type, "why": c.why, "paper_gib": c.paper.total_bytes / 2**30,
                "paper": {"weights_gib": c.paper.weights_bytes / 2**30, "kv_gib": c.paper.kv_bytes / 2**30,
                          "overhead_gib": c.paper.overhead_bytes / 2**30, "label": c.paper.label},
                **{k: v for k, v in asdict(self).items() if k not in ("candidate", "log")}}  # fmt: skip


async def measure(candidate: Candidate, budget_gib: float, margin: float, target_util: float, options: FitOptions,
                  say: Callable[[str], None]) -> Measurement:  # fmt: skip
    """Start, measure and stop one candidate's server."""
    from mellum_proxy.planning.launch import command_for

    result = Measurement(candidate)
    began = time.monotonic()
    watch = MemoryWatch(options.gpu)
    result.memory_source, result.memory_note = watch.source, watch.note
    result.budget_gib = budget_gib - (watch.before_mib / GIB_IN_MIB if watch.source == "nvml" else 0.0)
    _read(result, watch, "before start", None)
    port = free_port()
    watch.watch()
    try:
        server = await start(command_for(candidate, options.server_cmd, port, options.threads), port,
                             options.load_timeout_s)  # fmt: skip
    except LoadFailed as exc:
        result.fail(exc.kind, exc.line)
        result.log = exc.log
        say(f"  failed to start: {exc.line}")
        watch.close()
        result.took_s = time.monotonic() - began
        return result
    result.load_s = time.monotonic() - began
    try:
        say(f"  loaded in {result.load_s:.1f} s")
        _read(result, watch, "after load", server)
        await _exercise(result, server, watch, options, say)
        peak = await watch.peak_mib(server.process.pid)
        result.measured_peak_gib = None if peak is None else peak / GIB_IN_MIB
    finally:
        await server.stop()
        watch.close()
    result.log = server.log
    _read_log(result, server.log)
    result.status = _status(result, margin, target_util)
    result.took_s = time.monotonic() - began
    return result


def _read(result: Measurement, watch: MemoryWatch, phase: str, server: Running | None, note: str = "") -> None:
    used = watch.used_mib(server.process.pid if server else None) if server or watch.source == "nvml" else None
    result.readings.append({"phase": phase, "memory_mib": used, "source": watch.source, "note": note})


async def _exercise(result: Measurement, server: Running, watch: MemoryWatch, options: FitOptions,
                    say: Callable[[str], None]) -> None:  # fmt: skip
    candidate = result.candidate
    connector = aiohttp.TCPConnector(force_close=True)  # llama.cpp closes a connection after a streamed answer
    async with aiohttp.ClientSession(connector=connector) as session:
        client = UpstreamClient(session, server.url)
        found = await discover(client)
        counter = await upstream_counter(client, found.model)  # the server's own /tokenize, in its kind's shape
        probe = Prober(session, server.url, found.model)
        await asyncio.sleep(options.idle_s)  # the idle period being measured
        _read(result, watch, "after idle", server, f"{options.idle_s:g} s idle")
        code = code_text()
        phases = [("short", 400), ("long", None)]
        chars_per_token = 3.0
        for phase, chars in phases:
            try:
                async with asyncio.timeout(options.request_timeout_s):
                    ttft, tokens = await _at_once(probe, code, candidate, chars, chars_per_token, counter)
            except TimeoutError:
                result.fail("timeout", f"{phase} prompt: no answer within {options.request_timeout_s:.0f} s")
                return
            except (ProfileError, aiohttp.ClientError) as exc:
                died = server.process.returncode is not None
                kind = "oom" if OOM.search(str(exc)) or (died and OOM.search(server.log)) else "error"
                result.fail(f"{phase}_prompt_{'crash' if died and kind == 'error' else kind}", str(exc) or repr(exc))
                return
            result.ttft_ms[phase], result.prompt_tokens[phase] = ttft, tokens
            if phase == "short":
                chars_per_token = 400 / tokens if tokens else chars_per_token
                _read(result, watch, "after first request", server, f"{candidate.batch} short prompts at once")
            say(f"  {phase} prompt ({tokens} tokens, {candidate.batch} at once): first token {ttft:.0f} ms")
        timed = await probe.complete("def count():\n    ", DECODE_TOKENS)
        times = timed.token_times
        if len(times) > 2 and times[-1] > times[0]:
            result.decode_tps = (len(times) - 1) / (times[-1] - times[0])
        if options.quality is not None:
            result.quality = await spot_check(session, server.url, found.model, options.quality, counter)
            say(f"  quality: {result.quality['exact']} of {result.quality['tasks']} exact")


async def _at_once(probe: Prober, code: str, candidate: Candidate, chars: int | None, chars_per_token: float,
                   counter: Counter | None) -> tuple[float, int | None]:  # fmt: skip
    """The median first-token time of `batch` requests at once, and their prompt tokens. `chars` None: a
    near-limit prompt (the context less what is asked), cut by a tenth while the server says it is too long."""
    target = int((candidate.context - ASK_TOKENS - 8) * chars_per_token) if chars is None else chars
    if chars is None and counter is not None:  # sized by the server's own tokenizer where it has one
        target = await _sized(counter, code, candidate.context - ASK_TOKENS - 8, target)
    for _ in range(4):
        prompts = [f"# {secrets.token_hex(8)}\n" + code[:target] for _ in range(candidate.batch)]
        try:
            runs = await asyncio.gather(*(probe.complete(p, ASK_TOKENS) for p in prompts))
        except ProfileError as exc:
            if chars is None and "400" in str(exc)[:40]:
                target = int(target * 0.9)
                continue
            raise
        tokens = max((run.prompt_tokens or 0 for run in runs), default=0) or None
        return statistics.median(run.ttft_s * 1000 for run in runs), tokens
    raise ProfileError("the server refused every near-limit prompt as too long")


async def _sized(counter: Counter, code: str, goal: int, guess: int) -> int:
    """Characters of `code` that make about `goal` tokens (a nonce line before them), counted by the server."""
    for _ in range(3):
        try:
            tokens = await counter.count(code[:guess])
        except UpstreamError:
            return guess
        if not tokens or goal * 0.97 <= tokens + 16 <= goal:
            return guess
        guess = int(guess * (goal - 16) / tokens)
    return guess


def _read_log(result: Measurement, log: str) -> None:
    """The server's allocation lines beside the candidate's knobs: a mismatch is said."""
    found = parse_log(log)
    result.logged = {"backend": found.backend, "weights_bytes": found.weights_bytes, "kv_bytes": found.kv_bytes,
                     "compute_bytes": found.compute_bytes, "facts": found.facts}  # fmt: skip
    c, facts = result.candidate, found.facts
    if "n_ctx_seq" in facts and facts["n_ctx_seq"] != c.context:
        result.mismatches.append(f"the server holds {facts['n_ctx_seq']} tokens a sequence, not {c.context}")
    if "kv_type" in facts and str(facts["kv_type"]).lower() != c.kv_type:
        result.mismatches.append(f"the KV cache is {facts['kv_type']}, not {c.kv_type}")
    on_gpu, _, layers = str(facts.get("offloaded_layers", "")).partition("/")
    if layers and int(on_gpu) < int(layers):
        result.mismatches.append(f"only {on_gpu} of {layers} layers on the GPU: the rest run on the CPU")
    if "file_type" in facts and _quant_word(c.quant) != _quant_word(str(facts["file_type"])):
        result.mismatches.append(f"the file is {facts['file_type']}, not {c.quant}")


def _quant_word(name: str) -> str:
    """`Q4_K_M` and llama.cpp's `Q4_K - Medium` alike: `q4km`."""
    name = name.lower().replace("medium", "m").replace("small", "s").replace("large", "l")
    return re.sub(r"[^a-z0-9]", "", name)


def _status(result: Measurement, margin: float, target_util: float) -> str:
    if result.failures:
        return "failed"
    if result.measured_peak_gib is None or not result.budget_gib:
        return "ok"
    util = result.measured_peak_gib / result.budget_gib
    return "ok" if util <= min(1 - margin, target_util) else "tight" if util <= target_util else "over"
