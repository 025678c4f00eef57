"""The budget with a real BPE tokenizer: exact, nearest the cursor, stepped, unicode safe."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from mellum_proxy.budget import BUILTIN, BudgetSettings, CharsEstimator, ContextBudget, FimParts, HfTokenizer
from mellum_proxy.budget.context import EDGE_TOKENS
from mellum_proxy.budget.tokenizers import _char_offsets
from mellum_proxy.models import NormalizedRequest
from tests.conftest import corpus_texts

TEXT = "\n".join(corpus_texts())


def request(prefix: str, suffix: str | None, path: str | None = "inventory.py") -> NormalizedRequest:
    return NormalizedRequest(id="r", route="test", session="s", prefix=prefix, suffix=suffix, file_path=path)


def budget(tokenizer: Path | None, **settings: object) -> ContextBudget:
    options = {"max_context_tokens": 400, "max_tokens": 32, "template": BUILTIN["mellum"], **settings}
    counter = HfTokenizer(tokenizer) if tokenizer else CharsEstimator()
    return ContextBudget(BudgetSettings(**options), counter)  # type: ignore[arg-type]


async def test_budget_is_never_exceeded_and_keeps_the_text_nearest_the_cursor(bpe_tokenizer: Path) -> None:
    fit = budget(bpe_tokenizer)
    counter = HfTokenizer(bpe_tokenizer)
    rng = random.Random(7)
    for cursor in sorted(rng.sample(range(len(TEXT)), 60)):
        prefix, suffix = TEXT[:cursor], TEXT[cursor:]
        out = await fit.apply(request(prefix, suffix))
        counted = await counter.count(out.prompt)
        assert counted + out.max_tokens <= 400  # exact
        # measured, or cut after its measurement by the counts it gave: then a bound, within the edges' margin
        assert 0 <= out.tokens_after - counted <= 4 * EDGE_TOKENS
        parts = BUILTIN["mellum"].parse(out.prompt)
        assert parts is not None
        assert prefix.endswith(parts.prefix) and suffix.startswith(parts.suffix)  # nearest text kept
        cursor_line = prefix.rsplit("\n", 1)[-1]
        assert parts.prefix.endswith(cursor_line) or len(cursor_line) > 100
        assert out.truncated == (parts.prefix != prefix or parts.suffix != suffix)
        assert out.method == "tokenizer.json" and out.stops == ("<|endoftext|>", "<filename>")


async def test_budget_is_used_well(bpe_tokenizer: Path) -> None:
    out = await budget(bpe_tokenizer, step_lines=1).apply(request(TEXT[:5000], TEXT[5000:]))
    assert 368 - 25 <= out.tokens_after <= 368  # whole lines only: at most a line's worth unused


async def test_prefix_ratio_and_unused_budget_moves_over(bpe_tokenizer: Path) -> None:
    counter = HfTokenizer(bpe_tokenizer)
    fit = budget(bpe_tokenizer, step_lines=1, prefix_ratio=0.75)
    out = await fit.apply(request(TEXT[:6000], TEXT[6000:]))
    parts = BUILTIN["mellum"].parse(out.prompt)
    assert parts is not None
    p, s = len(await counter.offsets(parts.prefix)), len(await counter.offsets(parts.suffix))
    assert 0.6 < p / (p + s) < 0.85
    short_suffix = await fit.apply(request(TEXT[:6000], "\n}\n"))
    parts = BUILTIN["mellum"].parse(short_suffix.prompt)
    assert parts is not None and parts.suffix == "\n}\n"
    assert len(await counter.offsets(parts.prefix)) > 0.9 * (368 - 20)  # the suffix's unused share went left


async def test_window_start_moves_in_steps(bpe_tokenizer: Path) -> None:
    fit = budget(bpe_tokenizer, step_lines=16)
    starts = set()
    cursor = 6000
    for typed in range(40):  # type 40 characters at one place: the window must not slide each time
        prefix = TEXT[:cursor] + "x" * typed
        out = await fit.apply(request(prefix, TEXT[cursor:]))
        parts = BUILTIN["mellum"].parse(out.prompt)
        assert parts is not None
        starts.add(len(prefix) - len(parts.prefix))
    assert len(starts) <= 2


async def test_one_huge_line_is_cut_inside_at_a_token_boundary(bpe_tokenizer: Path) -> None:
    counter = HfTokenizer(bpe_tokenizer)
    line = "values = [" + ", ".join(f"'ünïcödé-{i}-✓'" for i in range(400))
    out = await budget(bpe_tokenizer).apply(request("import os\n" + line, "]\n"))
    parts = BUILTIN["mellum"].parse(out.prompt)
    assert parts is not None
    assert line.endswith(parts.prefix) and 0 < len(parts.prefix) < len(line)
    assert await counter.count(out.prompt) + 32 <= 400


async def test_plain_prompt_keeps_its_end(bpe_tokenizer: Path) -> None:
    counter = HfTokenizer(bpe_tokenizer)
    out = await budget(bpe_tokenizer).apply(request(TEXT, None))
    assert TEXT.endswith(out.prompt) and out.suffix is None and out.stops == ()
    assert await counter.count(out.prompt) + 32 <= 400
    small = await budget(bpe_tokenizer).apply(request("def f():\n", None))
    assert (small.prompt, small.truncated) == ("def f():\n", False)


async def test_pre_rendered_prompt_is_truncated_and_rendered_again(bpe_tokenizer: Path) -> None:
    rendered = BUILTIN["starcoder"].render(FimParts(TEXT[:7000], TEXT[7000:], "inventory.go"))
    out = await budget(bpe_tokenizer).apply(request(rendered, None))
    parts = BUILTIN["mellum"].parse(out.prompt)  # re-rendered with the configured (Mellum) template
    assert parts is not None and parts.path == "inventory.go"
    assert TEXT[:7000].endswith(parts.prefix) and TEXT[7000:].startswith(parts.suffix)


async def test_max_tokens_is_capped(bpe_tokenizer: Path) -> None:
    fit = budget(bpe_tokenizer, max_tokens=64)
    assert (await fit.apply(replace(request("a", "b"), max_tokens=500))).max_tokens == 64
    assert (await fit.apply(replace(request("a", "b"), max_tokens=0))).max_tokens == 0  # cache warming stays 0
    assert (await fit.apply(request("a", "b"))).max_tokens == 64


def test_byte_offsets_never_split_a_character() -> None:
    text = "aé✓b"  # 1 + 2 + 3 + 1 bytes
    # byte-level tokens: 'a', first byte of é, second byte of é, '✓' whole, 'b'
    assert _char_offsets(text, [1, 1, 1, 3, 1]) == [0, 1, 2, 3]
    assert _char_offsets(text, [2, 2, 3]) == [0, 2, 3]  # 'a'+half é, half é+..., rounded to char starts


async def test_chars_estimate_rarely_exceeds_after_calibration(bpe_tokenizer: Path) -> None:
    exact = HfTokenizer(bpe_tokenizer)
    fit = budget(None)
    rng = random.Random(3)
    exceeded = 0
    trials = 300
    for i in range(trials):
        cursor = rng.randrange(len(TEXT))
        out = await fit.apply(request(TEXT[:cursor], TEXT[cursor:]))
        true_tokens = await exact.count(out.prompt)
        exceeded += true_tokens + out.max_tokens > 400
        fit.observe(out.prompt, true_tokens)  # what the upstream's usage.prompt_tokens would report
        if i == 20:
            exceeded = 0  # count only after a short calibration
    assert exceeded / (trials - 21) < 0.01
    assert out.method == "chars"


async def test_other_files_are_dropped_first_even_with_the_chars_estimate() -> None:
    fit = budget(None)
    other = (("lib/util.py", TEXT[:40_000]),)  # far more than the budget (issue: 204 KB went upstream)
    request_ = replace(request(TEXT[:1000], TEXT[1000:2000]), context_files=other)
    out = await fit.apply(request_)
    assert "lib/util.py" not in out.prompt and out.truncated
    assert await CharsEstimator().count(out.prompt) + out.max_tokens <= 400 * 1.2
