"""Per-keystroke cost of an exact budget: one measurement per prompt, lines remembered between keystrokes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mellum_proxy.budget import BUILTIN, BudgetSettings, ContextBudget, HfTokenizer, UpstreamTokenizer
from mellum_proxy.models import NormalizedRequest
from tests.conftest import corpus_texts

TEXT = "\n".join(corpus_texts()) * 4


class CountingServer:
    """llama.cpp's `/tokenize` shape over a local tokenizer, counting the calls."""

    def __init__(self, tokenizer: HfTokenizer) -> None:
        self.tokenizer = tokenizer._tokenizer
        self.calls = 0

    async def tokenize(self, body: dict[str, Any]) -> Any:
        self.calls += 1
        encoding = self.tokenizer.encode(body["content"], add_special_tokens=bool(body.get("add_special")))
        text = body["content"]
        pieces = [text[start:end] for start, end in encoding.offsets]
        return {"tokens": [{"id": i, "piece": p} for i, p in zip(encoding.ids, pieces, strict=True)]}


def request(prefix: str, suffix: str) -> NormalizedRequest:
    return NormalizedRequest(id="r", route="test", session="s", prefix=prefix, suffix=suffix, file_path="a.py")


async def test_typing_costs_one_tokenize_per_keystroke_and_stays_exact(bpe_tokenizer: Path) -> None:
    exact = HfTokenizer(bpe_tokenizer)
    server = CountingServer(exact)
    settings = BudgetSettings(max_context_tokens=1024, max_tokens=32, template=BUILTIN["mellum"])
    fit = ContextBudget(settings, UpstreamTokenizer(server))
    cursor = TEXT.index("\n", len(TEXT) // 2) + 1
    await fit.apply(request(TEXT[:cursor], TEXT[cursor:]))  # a cold start: the sides are tokenized once
    before = server.calls
    keystrokes = 60
    for n in range(1, keystrokes + 1):
        out = await fit.apply(request(TEXT[:cursor] + "value = compute(x)"[: n % 19], TEXT[cursor:]))
        assert await exact.count(out.prompt) + out.max_tokens <= 1024  # exact, as the server counts
        assert out.tokens_after == await exact.count(out.prompt)
    assert server.calls - before <= keystrokes * 1.05  # one measurement per keystroke (a rare shrink round)
    assert len(fit.lines) > 0


async def test_far_text_is_never_tokenized(bpe_tokenizer: Path) -> None:
    server = CountingServer(HfTokenizer(bpe_tokenizer))
    seen: list[int] = []
    original = server.tokenize

    async def recording(body: dict[str, Any]) -> Any:
        seen.append(len(body["content"]))
        return await original(body)

    server.tokenize = recording  # type: ignore[method-assign]
    fit = ContextBudget(BudgetSettings(max_context_tokens=512, max_tokens=16, template=BUILTIN["mellum"]),
                        UpstreamTokenizer(server))  # fmt: skip
    huge = TEXT * 20
    await fit.apply(request(huge[: len(huge) // 2], huge[len(huge) // 2 :]))
    assert max(seen) <= 6 * 512 + 2000  # at most the pre-cut of one side (6 characters per token) and a line
