"""`mellum-proxy doctor LOG.jsonl [--probe FILE.csv]`: which knob to move first, and the evidence.

The tuning guide's failure table: fails at load -> quantization or a smaller model; fails only on long
inputs -> default context, then batch; fails only with several users -> limit concurrency, then batch;
memory free but slow -> batch or engine. Before them: a server that sleeps, when what fails is the first
completions after a break (they waited for its wake: `wake_ms`).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from mellum_proxy.telemetry.stats import percentile

FAILED = {"upstream_error", "timeout"}
SLOW_TTFT_MS = 1000.0
NEVER_REACHED = "upstream_unreachable"  # a record's `error` when no connection to the server could be made
MIN_FAILURES = 3  # a knob is named from this many failed or timed-out requests on, never from one


def _failure_rate(rows: list[dict[str, Any]]) -> float | None:
    return sum(r.get("outcome") in FAILED for r in rows) / len(rows) if rows else None


def _split_by(rows: list[dict[str, Any]], key: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """The top quarter of rows by `key` and the rest, with the threshold between them."""
    valued = [r for r in rows if isinstance(r.get(key), int | float)]
    if len(valued) < 8:
        return [], [], 0.0
    threshold = percentile([float(r[key]) for r in valued], 75) or 0.0
    high = [r for r in valued if float(r[key]) > threshold]
    return high, [r for r in valued if float(r[key]) <= threshold], threshold


def read_probe(path: Path) -> tuple[float | None, float | None]:
    """Peak used and total MiB from a `mellum-proxy probe --out` CSV."""
    peak = total = None
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            used, size = float(row["memory.used [MiB]"]), float(row["memory.total [MiB]"])
            peak = used if peak is None else max(peak, used)
            total = size
    return peak, total


def diagnose(records: list[dict[str, Any]], probe: tuple[float | None, float | None] = (None, None)) -> dict[str, Any]:
    never = [r for r in records if r.get("error") == NEVER_REACHED]
    tried = FAILED | {"ok"}
    reached = [
        r
        for r in records
        if r.get("error") != NEVER_REACHED and (r.get("reached_upstream") or r.get("outcome") in tried)
    ]
    if never and not any(r.get("outcome") == "ok" for r in reached):
        return {
            "verdict": "the server was never reached",
            "knob": "the address: --upstream (is the server started, and on that port?)",
            "evidence": [f"{len(never)} requests could not connect to the upstream (connection refused or no such "
                         f"host); {len(reached)} others reached it, none answered"],
        }  # fmt: skip
    if not reached:
        return {"verdict": "no evidence", "knob": None, "evidence": ["no request reached the upstream in this log"]}
    evidence: list[str] = []
    rate = _failure_rate(reached) or 0.0
    evidence.append(f"{len(reached)} requests reached the upstream; {rate:.0%} failed or timed out")
    ok = [r for r in reached if r.get("outcome") == "ok"]
    if rate >= 0.9 and not ok:
        return {
            "verdict": "fails at load (or the server is down)",
            "knob": "quantization, or a smaller model",
            "evidence": evidence,
        }
    failures = sum(r.get("outcome") in FAILED for r in reached)
    woken = sum(r.get("outcome") in FAILED and r.get("wake_ms") is not None for r in records)
    if woken >= MIN_FAILURES and woken * 2 >= failures:
        return {
            "verdict": "the first completions after a break fail while the server wakes "
            "(it unloads its model when idle)",
            "knob": "the server's idle limit (llama.cpp --sleep-idle-seconds, Ollama keep_alive: the proxy's "
            "--keep-alive, vLLM's sleep mode), or a timeout_ms that covers its load",
            "evidence": [*evidence, f"{woken} of the {failures} failed or timed-out requests waited for a wake"],
        }
    decoding = sum(r.get("outcome") == "timeout" and r.get("ttft_ms") is not None for r in reached)
    if decoding >= MIN_FAILURES and decoding * 2 >= failures:  # the first token came in time, the rest did not
        drafted = sum(r.get("draft_n") or 0 for r in reached)
        speculation = (f"; the server speculates already ({sum(r.get('draft_n_accepted') or 0 for r in reached)} of "
                       f"{drafted} drafted tokens accepted)" if drafted else "")  # fmt: skip
        return {
            "verdict": "completions time out while decoding: their first token came in time, the rest did not",
            "knob": "decode speed: the server's self-speculation (measured on your typing by `fit --spec`; "
            "embedded_spec, llama.cpp --spec-type), or a lower max_tokens",
            "evidence": [*evidence, f"{decoding} of the {failures} failed or timed-out requests had their first "
                         f"token and ended at the deadline while decoding{speculation}"],
        }  # fmt: skip
    for key, what, verdict, knob in (
        ("prompt_tokens_before", "prompts over {:g} tokens", "fails only on long inputs",
         "default context (max_context_tokens), then batch"),
        ("inflight", "requests that found over {:g} others in flight", "fails only with several requests at once",
         "limit concurrency (max_concurrency), then batch"),
    ):  # fmt: skip
        high, low, threshold = _split_by(reached, key)
        high_rate, low_rate = _failure_rate(high), _failure_rate(low)
        if high_rate is not None and low_rate is not None:
            evidence.append(f"{what.format(threshold)}: {high_rate:.0%} failed; the others: {low_rate:.0%}")
            pattern = high_rate >= 0.2 and high_rate >= 3 * max(low_rate, 0.02)
            if pattern and sum(r.get("outcome") in FAILED for r in high) >= MIN_FAILURES:
                return {"verdict": verdict, "knob": knob, "evidence": evidence}
    ttft = [float(r["ttft_ms"]) for r in ok if isinstance(r.get("ttft_ms"), int | float)]
    p90 = percentile(ttft, 90)
    if p90 is not None:
        evidence.append(f"ttft p90 {p90:.0f} ms over {len(ttft)} completed requests")
    peak, total = probe
    if peak is None:
        peaks = [float(r["vram_peak_mib"]) for r in records if isinstance(r.get("vram_peak_mib"), int | float)]
        peak = max(peaks) if peaks else None
    if peak is not None and total:
        evidence.append(f"GPU memory peak {peak:.0f} of {total:.0f} MiB ({peak / total:.0%})")
    if p90 is not None and p90 > SLOW_TTFT_MS and (peak is None or not total or peak / total < 0.7):
        return {
            "verdict": "memory free but slow",
            "knob": "batch (max_concurrency / -np), or the engine",
            "evidence": evidence,
        }
    if 0 < failures < MIN_FAILURES:
        return {
            "verdict": f"too few failures to tell ({failures} of {len(reached)})",
            "knob": None,
            "evidence": [*evidence, f"a knob is named from {MIN_FAILURES} failures on; run longer to see a pattern"],
        }
    if rate > 0.05:
        return {
            "verdict": "fails without a clear pattern",
            "knob": "timeouts first: read the upstream's log",
            "evidence": evidence,
        }
    return {"verdict": "healthy", "knob": None, "evidence": evidence}
