"""Context-budget benchmark (a benchmark, not a test): `python -m bench.budget_bench [--out DIR]`.

1. Truncation cost: fit a 1 MB source file (cursor in the middle) into the default budget (2048 tokens,
   Mellum template), median wall time per tokenizer method.
2. Prompt-cache reuse while typing: retype a stretch of code one character at a time in the middle of a
   file, send every keystroke's budgeted prompt to the embedded llama.cpp server (1 slot, max_tokens 1),
   and add up what the server says it took from its cache (`timings.cache_n`) against what it had to
   compute (`timings.prompt_n`), with the window edges moving in 16-line steps vs on every line. The
   server runs with `swa_full`: without it llama.cpp re-processes most of a gemma-3 prompt (sliding-window
   layers keep too little cache to reuse a prefix), whatever the proxy does.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.corpus import code_texts, train_bpe
from proxy.budget import BUILTIN, BudgetSettings, CharsEstimator, ContextBudget, HfTokenizer, UpstreamTokenizer
from proxy.budget.tokenizers import TokenCounter
from proxy.console import POSITIVE, Parser, whole
from proxy.models import NormalizedRequest
from proxy.upstream import UpstreamClient
from proxy.upstream.embedded import EmbeddedServer

CODE = "\n".join(code_texts())


def request(prefix: str, suffix: str) -> NormalizedRequest:
    return NormalizedRequest(id="b", dialect="bench", session="s", prefix=prefix, suffix=suffix, file_path="app.py")


async def truncation_times(counters: dict[str, TokenCounter], runs: int) -> dict[str, Any]:
    big = CODE * (1_048_576 // len(CODE) + 1)
    cursor = len(big) // 2
    results: dict[str, Any] = {"file_bytes": len(big.encode()), "runs": runs}
    for name, counter in counters.items():
        budget = ContextBudget(BudgetSettings(template=BUILTIN["mellum"]), counter)
        times = []
        for i in range(runs):
            started = time.perf_counter()
            out = await budget.apply(request(big[: cursor + i], big[cursor + i :]))
            times.append((time.perf_counter() - started) * 1000)
        results[name] = {"median_ms": statistics.median(times), "p90_ms": sorted(times)[int(0.9 * (runs - 1))],
                         "tokens_after": out.tokens_after, "tokens_before": out.tokens_before}  # fmt: skip
    return results


async def cache_reuse(upstream: UpstreamClient, step_lines: int, keystrokes: int, context: int) -> dict[str, Any]:
    settings = BudgetSettings(
        max_context_tokens=context, max_tokens=16, step_lines=step_lines, template=BUILTIN["mellum"]
    )
    budget = ContextBudget(settings, UpstreamTokenizer(upstream))
    cursor = CODE.index("func (inv *Inventory) Find")  # mid-corpus: both sides are longer than their shares
    typed = CODE[cursor : cursor + keystrokes]
    before, after = CODE[:cursor], CODE[cursor + keystrokes :]
    cached = computed = 0
    elapsed = []
    for n in range(1, keystrokes + 1):
        out = await budget.apply(request(before + typed[:n], after))
        body = {"prompt": out.prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": True}
        started = time.perf_counter()
        async with upstream.session.post(upstream.url("/completion"), json=body) as resp:
            timings = (await resp.json())["timings"]
        elapsed.append((time.perf_counter() - started) * 1000)
        cached += timings.get("cache_n", 0)
        computed += timings["prompt_n"]
    return {"step_lines": step_lines, "keystrokes": keystrokes, "max_context_tokens": context, "cached_tokens": cached,
            "computed_tokens": computed, "reuse": cached / (cached + computed),
            "median_request_ms": statistics.median(elapsed)}  # fmt: skip


async def main(out_dir: Path, runs: int, keystrokes: int, context: int) -> dict[str, Any]:
    server = EmbeddedServer(ctx_tokens=2048, slots=1, swa_full=True)
    url = await asyncio.to_thread(server.start)
    try:
        async with aiohttp.ClientSession() as session:
            upstream = UpstreamClient(session, url)
            with tempfile.TemporaryDirectory() as tmp:
                counters: dict[str, TokenCounter] = {
                    "tokenizer.json": HfTokenizer(train_bpe(Path(tmp) / "tokenizer.json")),
                    "upstream": UpstreamTokenizer(upstream),
                    "chars": CharsEstimator(),
                }
                timing = await truncation_times(counters, runs)
            reuse = [await cache_reuse(upstream, step, keystrokes, context) for step in (16, 1)]
    finally:
        server.stop()
    report = {"truncate_1mb": timing, "cache_reuse": reuse}
    write_report(out_dir / "budget.json", report)
    return report


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


def render(report: dict[str, Any]) -> str:
    timing = report["truncate_1mb"]
    lines = [f"Truncating a {timing['file_bytes'] / 1e6:.2f} MB file to 2048 tokens ({timing['runs']} runs):", "",
             "| tokenizer | median ms | p90 ms | tokens kept |", "|---|---|---|---|"]  # fmt: skip
    for name in ("tokenizer.json", "upstream", "chars"):
        row = timing[name]
        lines.append(f"| {name} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} | {row['tokens_after']} |")
    context = report["cache_reuse"][0]["max_context_tokens"]
    lines += ["", f"Prompt-cache reuse while typing, {context}-token budget (llama.cpp `timings.cache_n`):", "",
              "| window edges | keystrokes | cached tokens | computed tokens | reuse | median request ms |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for row in report["cache_reuse"]:
        label = f"{row['step_lines']}-line steps" if row["step_lines"] > 1 else "every line (naive)"
        lines.append(f"| {label} | {row['keystrokes']} | {row['cached_tokens']} | {row['computed_tokens']} | "
                     f"{row['reuse']:.0%} | {row['median_request_ms']:.0f} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/reports"))
    parser.add_argument("--runs", type=POSITIVE, default=30)
    parser.add_argument("--keystrokes", type=POSITIVE, default=300)
    parser.add_argument("--context-tokens", type=whole(64), default=1024, help="budget for the cache-reuse run")
    args = parser.parse_args()
    print(render(asyncio.run(main(args.out, args.runs, args.keystrokes, args.context_tokens))))
