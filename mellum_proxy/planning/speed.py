"""`fit --spec` and `--cache-reuse`: the server's speed knobs, measured on the person's own typing.

At the chosen memory candidate (its context, batch and cache type held), each speed candidate is the server started
again with one knob changed (self-speculation, or KV shifting), and the typing (`--trace`, the shipped
`json-crdt-blog-post` by default) replayed through the proxy in real time against it: the time from each pause to
its first text (p50, p95), the pauses covered, the decode rate, the draft acceptance from the server's own timings,
the prompt tokens computed (the server's `/metrics` count over the replay: every prefill that reached its first
token, requests a keystroke cut later included; llama.cpp does not count a prefill cut before it) and reused
(`cache_n`, over the answers that ran to their end: a cancelled one reports none). The replay's completions a newer
keystroke cut short never get the server's closing timings, so after it the text the person ended with is completed
whole `PROBES` times (llama.cpp's `/completion`), and their timings join the replay's: the decode rate and what was
drafted and accepted, as the server counts them. The baseline (no speculation, the first `--cache-reuse`) runs
twice: the difference between its two turns is the run-to-run spread. The rule: a knob's lowest first-text p95 wins
only where it beats the baseline's by more than that spread; otherwise the baseline stands."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mellum_proxy.planning.candidates import Candidate
from mellum_proxy.planning.launch import LoadFailed, command_for, start
from mellum_proxy.planning.measure import FitOptions
from mellum_proxy.urls import free_port

SHIPPED_TRACE = "json-crdt-blog-post.json.gz"  # mellum_proxy/tuning/traces, with its licence
BASELINE = "none"
PROBES = 3  # whole completions of the final text, for the server's own decode and draft figures
PROBE_TOKENS = 48
PROBE_CHARS = 3000  # of the text before the last edit


@dataclass(frozen=True, slots=True)
class SpeedRun:
    """One speed candidate's replay (`turn` 2: the baseline again, for the spread)."""

    spec: str
    cache_reuse: int
    turn: int = 1
    failure: str | None = None  # the server refused the knob (its own line)
    first_text_p50_ms: float | None = None
    first_text_p95_ms: float | None = None
    pause_coverage: float | None = None
    decode_tps: float | None = None
    draft_acceptance: float | None = None  # None: nothing drafted (no speculation, or no n-gram to draft from)
    drafted: int = 0  # tokens the server drafted, over the replay's finished completions and the probes
    prompt_computed: int | None = None
    prompt_cached: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.first_text_p95_ms is not None

    def summary(self, candidate: Candidate) -> dict[str, Any]:
        return {"spec": self.spec, "cache_reuse": self.cache_reuse, "turn": self.turn, "context": candidate.context,
                "batch": candidate.batch, "kv_type": candidate.kv_type, "status": "ok" if self.ok else "failed",
                "failure": self.failure,
                "first_text_ms": {"p50": self.first_text_p50_ms, "p95": self.first_text_p95_ms},
                "pause_coverage": self.pause_coverage, "decode_tps": self.decode_tps,
                "draft_acceptance": self.draft_acceptance, "drafted": self.drafted,
                "prompt_tokens": {"computed": self.prompt_computed, "cached": self.prompt_cached}}  # fmt: skip


def plan(specs: Sequence[str], cache_reuses: Sequence[int]) -> list[tuple[str, int, int]]:
    """(spec, cache_reuse, turn) one variable at a time: the baseline twice, each other speculation at the first
    cache reuse, each other cache reuse without speculation."""
    first = cache_reuses[0] if cache_reuses else 0
    runs = [(BASELINE, first, 1), (BASELINE, first, 2)]
    runs += [(spec, first, 1) for spec in dict.fromkeys(specs) if spec != BASELINE]
    runs += [(BASELINE, reuse, 1) for reuse in dict.fromkeys(cache_reuses) if reuse != first]
    return runs


def choose(runs: Sequence[SpeedRun]) -> tuple[str, int, str]:
    """The speculation and cache reuse to serve with, and why (see the module docstring)."""
    baseline = [r for r in runs if r.spec == BASELINE and r.ok]
    if not baseline:
        return BASELINE, 0, "the baseline did not run: no speed knob is claimed"
    first = baseline[0].cache_reuse
    turns = [r.first_text_p95_ms for r in baseline if r.cache_reuse == first and r.first_text_p95_ms is not None]
    reference = statistics.fmean(turns)
    spread = max(turns) - min(turns) if len(turns) > 1 else 0.0
    picks, reasons = {}, []
    speculating = [r for r in runs if r.ok and r.spec != BASELINE]
    reusing = [r for r in runs if r.ok and r.spec == BASELINE and r.cache_reuse != first]
    for knob, others in (("spec", speculating), ("cache_reuse", reusing)):
        best = min(others, key=lambda r: r.first_text_p95_ms or float("inf"), default=None)
        if best is not None and best.first_text_p95_ms is not None and reference - best.first_text_p95_ms > spread:
            picks[knob] = best
            reasons.append(f"{knob} {getattr(best, knob)}: first-text p95 {best.first_text_p95_ms:.0f} ms against "
                           f"{reference:.0f} ms without, beyond the spread of {spread:.0f} ms")  # fmt: skip
        elif best is not None and best.first_text_p95_ms is not None:
            how = "slower than" if best.first_text_p95_ms > reference else "within the spread of"
            reasons.append(f"{knob}: the best, {getattr(best, knob)} at {best.first_text_p95_ms:.0f} ms, is {how} "
                           f"{reference:.0f} ms without (spread {spread:.0f} ms): not claimed")  # fmt: skip
    spec = picks["spec"].spec if "spec" in picks else BASELINE
    reuse = picks["cache_reuse"].cache_reuse if "cache_reuse" in picks else first
    return spec, reuse, "; ".join(reasons) or "only the baseline was asked for"


async def measure(candidate: Candidate, options: FitOptions, runs: list[tuple[str, int, int]], events: list[Any],
                  max_tokens: int, timeout_ms: int | None, say: Callable[[str], None]) -> list[SpeedRun]:  # fmt: skip
    """Each planned run: the server started with its knobs, the typing replayed through a proxy, the server
    stopped."""
    from mellum_proxy.tuning.runners.policy import Policy
    from mellum_proxy.tuning.runners.replay import run_policy

    settings: dict[str, Any] = {"max_context_tokens": candidate.context, "max_concurrency": candidate.batch}
    if timeout_ms is not None:
        settings["timeout_ms"] = timeout_ms
    measured = []
    for number, (spec, reuse, turn) in enumerate(runs, 1):
        label = f"spec {spec}, cache reuse {reuse}" + (" (again, for the spread)" if turn > 1 else "")
        say(f"[speed {number}/{len(runs)}] {label}")
        port = free_port()
        try:
            server = await start(command_for(candidate, options.server_cmd, port, options.threads, spec, reuse), port,
                                 options.load_timeout_s)  # fmt: skip
        except LoadFailed as exc:
            say(f"  failed: {exc.kind}: {exc.line}")
            measured.append(SpeedRun(spec, reuse, turn, failure=f"{exc.kind}: {exc.line}"))
            continue
        try:
            result = await run_policy(Policy("fit's choice", settings), events, server.url, max_tokens=max_tokens)
            probed = await _probe(server.url, events)
        finally:
            await server.stop()
        run = _run(spec, reuse, turn, result, probed)
        say(f"  first text p50 {_ms(run.first_text_p50_ms)} / p95 {_ms(run.first_text_p95_ms)} ms, "
            f"decode {_num(run.decode_tps)} tok/s, draft acceptance {_num(run.draft_acceptance, 2)}")  # fmt: skip
        measured.append(run)
    return measured


async def _probe(url: str, events: list[Any]) -> dict[str, float]:
    """`PROBES` whole completions of the text before the person's last edit, straight to the server: the sums of
    its timings' `predicted_n`, `predicted_ms`, `draft_n` and `draft_n_accepted` (empty where it has no
    `/completion`, as vLLM)."""
    import aiohttp

    prompt = final_text(events)[-PROBE_CHARS:]
    sums: dict[str, float] = {}
    body = {"prompt": prompt, "n_predict": PROBE_TOKENS, "temperature": 0, "cache_prompt": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for _ in range(PROBES):
            try:
                async with session.post(url + "/completion", json=body) as resp:
                    timings = (await resp.json()).get("timings") if resp.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return {}
            for key in ("predicted_n", "predicted_ms", "draft_n", "draft_n_accepted"):
                value = timings.get(key) if isinstance(timings, dict) else None
                if isinstance(value, int | float) and not isinstance(value, bool):
                    sums[key] = sums.get(key, 0) + value
    return sums


def final_text(events: list[Any]) -> str:
    """The text before the cursor after the last event (`Documents`: the trace's files as edited)."""
    from mellum_proxy.tuning.workloads.trace import Documents

    documents = Documents()
    for event in events:
        documents.apply(event)
    last = events[-1].file if events else ""
    return documents.texts.get(last, "")[: documents.cursor.get(last, 0)]


def _run(spec: str, reuse: int, turn: int, result: Any, probed: dict[str, float]) -> SpeedRun:
    drafted = (result.draft_n or 0) + probed.get("draft_n", 0)
    accepted = (result.draft_n_accepted or 0) + probed.get("draft_n_accepted", 0)
    decode = probed["predicted_n"] * 1000 / probed["predicted_ms"] if probed.get("predicted_ms") else None
    if decode is None and result.decode_ms_per_token:
        decode = 1000 / result.decode_ms_per_token
    return SpeedRun(
        spec, reuse, turn, first_text_p50_ms=result.latency_p50_ms, first_text_p95_ms=result.latency_p95_ms,
        pause_coverage=result.pause_coverage, decode_tps=decode,
        draft_acceptance=accepted / drafted if drafted else None, drafted=int(drafted),
        prompt_computed=_computed(result), prompt_cached=result.record_cached_tokens,
    )  # fmt: skip


def _computed(result: Any) -> int | None:
    """The prompt tokens the server computed over the replay: its own count (`/metrics`), every request the typing
    sent whose prefill reached its first token (llama.cpp counts a prefill there, so one cut before it is not
    counted); else the answers' (`usage`) less what they reused, where it has no `/metrics`."""
    if result.upstream_prompt_tokens is not None:
        return int(result.upstream_prompt_tokens)
    return result.record_prompt_tokens - result.record_cached_tokens if result.record_prompt_tokens else None


def read_events(traces: Sequence[Path], limit: int) -> tuple[str, list[Any]]:
    """The typing to replay: the first `--trace`, else the shipped trace; at most `limit` edits.

    Raises:
        OSError, ValueError: a trace that cannot be read.
    """
    from mellum_proxy.tuning.runners.tune import read_typing
    from mellum_proxy.tuning.workloads.corpus import BENCH_DIR
    from mellum_proxy.tuning.workloads.trace import Trace, limited

    path = traces[0] if traces else BENCH_DIR / "traces" / SHIPPED_TRACE
    return path.name, list(limited(Trace(read_typing(path)), limit))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
