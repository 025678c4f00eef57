"""Per-keystroke cost of an exact budget: one measurement per prompt, lines remembered between keystrokes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mellum_proxy.budget import BUILTIN, BudgetSettings, ContextBudget, HfTokenizer, UpstreamTokenizer
from mellum_proxy.budget.context import EDGE_TOKENS
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
    upstream = UpstreamTokenizer(server)
    await upstream.ready()  # what the server adds (BOS): asked where the tokenizer is chosen
    fit = ContextBudget(settings, upstream)
    cursor = TEXT.index("\n", len(TEXT) // 2) + 1
    before = server.calls
    await fit.apply(request(TEXT[:cursor], TEXT[cursor:]))  # a cold document: all that could fit, measured once
    assert server.calls - before == 1
    keystrokes = 60
    for n in range(1, keystrokes + 1):
        before = server.calls
        out = await fit.apply(request(TEXT[:cursor] + "value = compute(x)"[: n % 19], TEXT[cursor:]))
        assert server.calls - before == 1  # one measurement per keystroke, a prompt cut after it included
        counted = await exact.count(out.prompt)
        assert counted + out.max_tokens <= 1024  # within the budget, as the server counts
        assert 0 <= out.tokens_after - counted <= 4 * EDGE_TOKENS  # measured, or a bound within the edges' margin
    assert len(fit.lines) > 0


async def test_a_new_file_and_its_other_files_cost_one_tokenize(bpe_tokenizer: Path) -> None:
    """A cold document with other files that do not fit: the template's own count, both sides' lines and the
    other files' tokens all come from one measurement, and the cut prompt is not measured again."""
    exact = HfTokenizer(bpe_tokenizer)
    server = CountingServer(exact)
    upstream = UpstreamTokenizer(server)
    await upstream.ready()
    fit = ContextBudget(BudgetSettings(max_context_tokens=512, max_tokens=32, template=BUILTIN["mellum"]), upstream)
    cursor = TEXT.index("\n", len(TEXT) // 3) + 1
    files = (("other.py", TEXT[:3000]), ("third.py", TEXT[-2000:]))
    for path in ("a.py", "b.py", "c.py"):  # each a file the template's own tokens were never counted with
        before = server.calls
        one = NormalizedRequest(id="r", route="test", session="s", prefix=TEXT[:cursor], suffix=TEXT[cursor:],
                                file_path=path, context_files=files)  # fmt: skip
        out = await fit.apply(one)
        assert server.calls - before == 1
        counted = await exact.count(out.prompt)
        assert counted + 32 <= 512 and "other.py" not in out.prompt  # the other files went first
        assert 0 <= out.tokens_after - counted <= 4 * EDGE_TOKENS


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
