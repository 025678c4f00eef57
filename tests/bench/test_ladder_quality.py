"""Ladder prompt cutting (exact, real tokenizer), cell accounting with induced failures, quality tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from benchmarks.reporting import ladder_report
from benchmarks.runners import ladder
from mellum_proxy.budget import HfTokenizer
from mellum_proxy.tuning.reporting import quality_report
from mellum_proxy.tuning.runners import quality
from mellum_proxy.tuning.sim.responder import Responder
from mellum_proxy.tuning.workloads.corpus import code_texts

CODE = "\n".join(code_texts())


@pytest.mark.parametrize("tokens", [64, 256, 1000, 1792])
async def test_prompts_are_cut_to_exact_token_counts(bpe_tokenizer: Path, tokens: int) -> None:
    counter = HfTokenizer(bpe_tokenizer)
    text = CODE * 3
    cut = await ladder.cut_to_tokens(text, tokens, counter)
    assert text.startswith(cut)
    assert await counter.count(cut) == tokens


async def test_a_snippet_too_short_says_so(bpe_tokenizer: Path) -> None:
    with pytest.raises(ValueError, match="only"):
        await ladder.cut_to_tokens("x = 1\n", 500, HfTokenizer(bpe_tokenizer))


def flaky_server(fail_every: int) -> web.Application:
    """Streams 3 tokens; every `fail_every`-th request is refused as llama.cpp refuses an oversized one."""
    count = {"n": 0}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        count["n"] += 1
        if count["n"] % fail_every == 0:
            return web.json_response({"error": {"code": 503, "message": "CUDA error: out of memory"}}, status=503)
        answer = Responder(request, body | {"stream": True}, f"flaky-{count['n']}", "m")
        for piece in ("a", "b", "c"):
            await answer.write(piece)
        return await answer.finish("length", {"prompt_tokens": len(body["prompt"]), "completion_tokens": 3})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


async def test_cells_count_requests_tokens_and_failures_by_kind(aiohttp_server: Any) -> None:
    server = await aiohttp_server(flaky_server(fail_every=3))
    url = str(server.make_url("/v1/completions"))
    cells = await ladder.run_ladder(url, {10: "x" * 10, 20: "y" * 20}, [1, 2], repeat=3, max_tokens=3)
    assert [(c.context, c.concurrency) for c in cells] == [(10, 1), (10, 2), (20, 1), (20, 2)]  # one variable a row
    summaries = [c.summary() for c in cells]
    assert [s["requests"] for s in summaries] == [3, 4, 3, 4]  # whole groups of 2: no lone request averaged in
    assert sum(sum(s["failures"].values()) for s in summaries) == 4  # 14 requests, every 3rd refused
    assert all(kind == "out_of_memory (503)" for s in summaries for kind in s["failures"])
    assert summaries[0]["prompt_tokens"] == [10] and summaries[2]["prompt_tokens"] == [20]
    assert all(s["ttft_p50_ms"] is not None and s["ttft_p50_ms"] <= s["total_p50_ms"] for s in summaries)
    assert summaries[0]["vram_peak_mib"] is None  # no GPU sampler: null, not zero
    table = ladder_report.table(cells)
    assert table.count("\n") == 5 and "out_of_memory (503) x1" in table


async def test_refused_and_timed_out_requests_are_failures(unused_tcp_port: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        attempt = await ladder.one_request(session, f"http://127.0.0.1:{unused_tcp_port}/v1/completions", "x", 2, 5)
    assert attempt.failure == "refused"


def test_tasks_are_deterministic_single_lines() -> None:
    problems = quality.load_problems()
    assert (
        len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0" and problems[10]["task_id"] == "HumanEval/10"
    )
    tasks = quality.build_tasks(problems)
    assert tasks == quality.build_tasks(quality.load_problems())
    first = tasks[0]
    problem = problems[0]
    solution_lines = problem["canonical_solution"].split("\n")
    assert first.id == "HumanEval/0/L0" and first.expected == solution_lines[0].strip()
    assert first.prefix == problem["prompt"] + first.indent and first.suffix.startswith("\n")
    assert first.prefix + first.expected + first.suffix == problem["prompt"] + problem["canonical_solution"]
    assert all(t.expected and "\n" not in t.expected for t in tasks)
    assert len(tasks) > 1000


@pytest.mark.parametrize(
    ("generated", "expected", "ok"),
    [
        ("  return x + 1", "return x + 1", True),
        ("return x + 1\n    print(1)", "return x + 1", True),  # only the first line counts
        ("return x+1", "return x + 1", False),
        ("", "return x", False),
        ("return x + 1  ", "return x + 1", True),
    ],
)
def test_exact_match(generated: str, expected: str, ok: bool) -> None:
    assert quality.exact_match(generated, expected) is ok


def test_splice_and_execute_the_canonical_line() -> None:
    problems = quality.load_problems()
    task = quality.build_tasks(problems)[0]
    assert quality._execute(problems[0], task, task.expected) is True
    assert quality._execute(problems[0], task, "return None") is False


def test_compare_lists_what_got_worse() -> None:
    a = {"tasks": [{"id": "t1", "exact": True}, {"id": "t2", "exact": False}, {"id": "t3", "exact": True}]}
    b = {"tasks": [{"id": "t1", "exact": False}, {"id": "t2", "exact": True}, {"id": "t3", "exact": True}]}
    assert quality_report.compare(a, b) == {"scored_by": "exact", "common_tasks": 3, "worse": ["t1"], "better": ["t2"]}


def test_request_bodies() -> None:
    task = quality.build_tasks(quality.load_problems())[0]
    direct = quality.request_body(task, "mellum", via_proxy=False, max_tokens=48)
    assert direct["prompt"].startswith("<fim_suffix>") and direct["prompt"].endswith("<fim_middle>")
    assert "suffix" not in direct and direct["stop"][0] == "\n"
    proxied = quality.request_body(task, "mellum", via_proxy=True, max_tokens=48)
    assert (proxied["prompt"], proxied["suffix"]) == (task.prefix, task.suffix)


def test_the_budget_bench_counts_a_reused_answer_as_no_prompt() -> None:
    """A keystroke typed through the last completion is answered without `usage` (no upstream request):
    `benchmarks budget` once crashed on it with KeyError: 'usage'."""
    from benchmarks.runners.budget import CONTEXT, MAX_TOKENS, over_budget

    assert over_budget({"choices": [{"text": "rest"}]}) is False
    assert over_budget({"usage": {"prompt_tokens": CONTEXT - MAX_TOKENS}}) is False
    assert over_budget({"usage": {"prompt_tokens": CONTEXT - MAX_TOKENS + 1}}) is True


async def test_the_quality_command_writes_its_run(fake_upstream: Any, tmp_path: Path) -> None:
    import asyncio

    import orjson

    from mellum_proxy.cli import main

    _, url = await fake_upstream(pieces=["return", " x\n", "    return x\n"])
    out = tmp_path / "q"
    args = ["bench", "quality", "--upstream", url, "--limit", "3", "--multiline", "--out", str(out)]
    await asyncio.to_thread(main, args)
    run = orjson.loads((out / "quality.json").read_bytes())
    assert run["summary"]["tasks"] == 3 and run["multiline"] is True
    assert [task["generated"] for task in run["tasks"]] == ["return x\n    return x\n"] * 3
