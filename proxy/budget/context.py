"""`ContextBudget`: fit a request into `max_context_tokens`, nearest the cursor, in stable steps.

For a fill-in-the-middle request the prompt budget (`max_context_tokens - max_tokens`, less the
template's own tokens) is split between prefix and suffix by `prefix_ratio`; budget one side does not
need goes to the other. Whole lines are dropped from the far end of the prefix and of the suffix. The
window edges move on a grid of `step_lines` lines, so consecutive keystrokes send the same start of
prompt and the server's prompt cache keeps matching. Only a single line larger than its budget is cut
inside, at a token boundary (never inside a character or a special token). With an exact tokenizer the
rendered prompt is counted once more and shrunk until it fits. A prompt whose UTF-8 length (plus
`SLACK_TOKENS`) is within the budget fits whatever the tokenizer, so it is sent whole and not counted
(the record's `tokenizer` says `bytes`, its token fields hold that upper bound).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from proxy.budget.templates import FimParts, FimTemplate, parse_any
from proxy.budget.tokenizers import CharsEstimator, TokenCounter
from proxy.errors import UpstreamError
from proxy.models import BudgetedPrompt, NormalizedRequest

log = logging.getLogger("mellum_proxy.budget")

PRECUT_CHARS_PER_TOKEN = 6  # code averages 3-4 characters a token; text beyond this is never tokenized
MAX_SHRINK_ROUNDS = 8
SLACK_TOKENS = 8  # what a server may add to a prompt's own tokens (BOS, EOS, a leading space, FIM markers)
BOUND_METHOD = "bytes"  # the record's `tokenizer` when the prompt fitted by its length, uncounted


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    max_context_tokens: int = 2048
    max_tokens: int = 128
    prefix_ratio: float = 0.75
    step_lines: int = 16
    template: FimTemplate | None = None  # None: send prompt and suffix as fields ("none")


@dataclass(frozen=True, slots=True)
class _Side:
    """One side of the cursor, pre-cut and counted per line."""

    lines: list[str]
    counts: list[int]
    offsets: list[int]  # token starts within "".join(lines)
    dropped_chars: int  # characters beyond the pre-cut, never tokenized

    @property
    def tokens(self) -> int:
        return sum(self.counts)


class ContextBudget:
    def __init__(self, settings: BudgetSettings, counter: TokenCounter) -> None:
        self.settings = settings
        self.counter = counter
        self._fallback = CharsEstimator()
        self._overheads: dict[tuple[str, str | None, str | None], int] = {}

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        """Calibration from the upstream's reported `usage.prompt_tokens`."""
        self.counter.observe(prompt, prompt_tokens)
        self._fallback.observe(prompt, prompt_tokens)

    async def apply(self, request: NormalizedRequest) -> BudgetedPrompt:
        """Fit `request` into the budget. An upstream tokenizer that fails falls back to `chars`."""
        try:
            return await self._apply(request, self.counter)
        except UpstreamError as exc:
            log.warning("tokenizer %s failed (%s); estimating from characters", self.counter.method, exc)
            return await self._apply(request, self._fallback)

    async def _apply(self, request: NormalizedRequest, counter: TokenCounter) -> BudgetedPrompt:
        settings = self.settings
        cap = settings.max_tokens
        max_tokens = cap if request.max_tokens is None else min(request.max_tokens, cap)
        context_limit = min(settings.max_context_tokens, request.context_tokens or settings.max_context_tokens)
        prompt_budget = max(1, context_limit - max_tokens)
        parts, template, suffix_field = self._parts(request)
        small = _fits_by_length(template, parts, prompt_budget, suffix_field)
        if small is not None:
            prompt, bound = small
            return BudgetedPrompt(
                prompt=prompt, suffix=parts.suffix if suffix_field else None, max_tokens=max_tokens,
                stops=template.stops if template else (), tokens_before=bound, tokens_after=bound, truncated=False,
                method=BOUND_METHOD,
            )  # fmt: skip
        overhead = await self._overhead(template, parts.path, counter)
        available = max(0, prompt_budget - overhead)
        prefix_lines, suffix_lines = parts.prefix.splitlines(keepends=True), parts.suffix.splitlines(keepends=True)
        # The most each side could get: a token has at least one character, so characters bound the need.
        p_most, s_most = _split(available, settings.prefix_ratio, len(parts.prefix), len(parts.suffix))
        prefix = await self._side(prefix_lines, p_most, counter, from_end=True)
        suffix = await self._side(suffix_lines, s_most, counter, from_end=False)
        tokens_before = overhead + _estimate_total(prefix) + _estimate_total(suffix)
        p_budget, s_budget = _split(available, settings.prefix_ratio, prefix.tokens, suffix.tokens)
        context = parts.context
        for _ in range(MAX_SHRINK_ROUNDS):
            kept_prefix = _tail(prefix, p_budget, settings.step_lines, template)
            kept_suffix = _head(suffix, s_budget, settings.step_lines, template)
            fim = FimParts(kept_prefix, kept_suffix, parts.path, context)
            prompt = _render(template, fim)
            total = await counter.count(prompt)
            if template is None and kept_suffix:
                total += len(await counter.offsets(kept_suffix))  # the suffix field, tokenized by the server
            if total <= prompt_budget or not counter.exact:
                break
            if context:
                context = ""  # other files are dropped before any line of the current one
                continue
            over = total - prompt_budget
            if p_budget >= s_budget:
                p_budget = max(0, p_budget - over)
            else:
                s_budget = max(0, s_budget - over)
        return BudgetedPrompt(
            prompt=prompt,
            suffix=kept_suffix if suffix_field else None,
            max_tokens=max_tokens,
            stops=template.stops if template else (),
            tokens_before=max(tokens_before, total),
            tokens_after=total,
            truncated=(kept_prefix, kept_suffix, context) != (parts.prefix, parts.suffix, parts.context),
            method=counter.method,
        )

    def _parts(self, request: NormalizedRequest) -> tuple[FimParts, FimTemplate | None, bool]:
        """The parts to fit, the template to render them with, and whether the suffix travels as a field."""
        template = self.settings.template
        if request.suffix is not None:
            files = _context_files(template, request.context_files)
            return FimParts(request.prefix, request.suffix, request.file_path, files), template, template is None
        parsed = parse_any(request.prefix)
        if parsed is None:  # a plain completion: only the end of the prompt matters
            return FimParts(request.prefix, "", None), None, False
        found, parts = parsed
        chosen = template or found  # re-render with the configured template, else with the client's own
        return parts, chosen, False

    async def _overhead(self, template: FimTemplate | None, path: str | None, counter: TokenCounter) -> int:
        """Tokens of the template itself (and BOS), counted once per template, path and tokenizer."""
        key = (counter.method, template.name if template else None, path)
        if key not in self._overheads:
            if len(self._overheads) > 1024:
                self._overheads.clear()
            self._overheads[key] = await counter.count(_render(template, FimParts("", "", path)))
        return self._overheads[key]

    async def _side(self, lines: list[str], budget: int, counter: TokenCounter, from_end: bool) -> _Side:
        """Pre-cut `lines` on the step grid to what could possibly fit, then count tokens per line."""
        limit = max(1, budget) * PRECUT_CHARS_PER_TOKEN
        step = self.settings.step_lines
        kept = lines
        if sum(map(len, lines)) > limit:
            kept = _precut(lines, limit, step, from_end)
        counts, offsets = await _count_lines("".join(kept), counter, kept)
        return _Side(kept, counts, offsets, sum(map(len, lines)) - sum(map(len, kept)))


def _fits_by_length(
    template: FimTemplate | None, parts: FimParts, budget: int, suffix_field: bool
) -> tuple[str, int] | None:
    """The whole prompt and its token bound, when its UTF-8 length alone proves it fits.

    No tokenizer makes more tokens than the text has bytes (every token covers at least one byte,
    a special token many), plus the few the server adds (BOS, EOS, a SentencePiece space, the FIM
    markers of template `none`): `SLACK_TOKENS`. Characters bound bytes from below, so a long prompt
    is turned away before it is encoded.
    """
    room = budget - SLACK_TOKENS
    if len(parts.prefix) + len(parts.suffix) + len(parts.context) + 64 > room:
        return None
    prompt = _render(template, parts)
    size = len(prompt.encode()) + (len(parts.suffix.encode()) if suffix_field else 0)
    if size > room:
        return None
    return prompt, size + SLACK_TOKENS


def _context_files(template: FimTemplate | None, files: tuple[tuple[str, str], ...]) -> str:
    """Other files in the template's own layout (`<filename>{path}\n{text}\n` for Mellum); templates
    without a file header cannot carry them, so they are left out."""
    if template is None or "{path}" not in template.header:
        return ""
    return "".join(template.header.replace("{path}", path) + text.rstrip("\n") + "\n" for path, text in files)


def _render(template: FimTemplate | None, parts: FimParts) -> str:
    if template is None:
        return parts.context + parts.prefix  # the suffix, if any, travels as its own field
    return template.render(parts)


async def _count_lines(text: str, counter: TokenCounter, lines: list[str] | None = None) -> tuple[list[int], list[int]]:
    """Tokens per line of `text`, from one tokenization."""
    lines = text.splitlines(keepends=True) if lines is None else lines
    offsets = await counter.offsets(text) if text else []
    starts, position = [], 0
    for line in lines:
        starts.append(position)
        position += len(line)
    counts = [0] * len(lines)
    for offset in offsets:
        counts[bisect.bisect_right(starts, offset) - 1] += 1
    return counts, offsets


def _precut(lines: list[str], limit: int, step: int, from_end: bool) -> list[str]:
    """The largest grid-aligned run of lines (at the end, or the start) within `limit` characters."""
    total, n = 0, len(lines)
    if from_end:
        start = n
        for i in range(n - 1, -1, -1):
            total += len(lines[i])
            if total > limit:
                break
            start = i
        aligned = -(-start // step) * step  # round up to the grid
        return lines[min(aligned, max(start, n - 1)) :] if start < n else lines[-1:]
    end = 0
    for i in range(n):
        total += len(lines[i])
        if total > limit:
            break
        end = i + 1
    aligned = (end // step) * step
    return lines[: max(aligned, min(end, 1))] if end else lines[:1]


def _split(available: int, ratio: float, need_prefix: int, need_suffix: int) -> tuple[int, int]:
    """Prefix and suffix budgets; what one side does not need goes to the other."""
    p_share = int(available * ratio)
    s_share = available - p_share
    if need_prefix < p_share:
        s_share += p_share - need_prefix
        p_share = need_prefix
    elif need_suffix < s_share:
        p_share += s_share - need_suffix
        s_share = need_suffix
    return p_share, s_share


def _tail(side: _Side, budget: int, step: int, template: FimTemplate | None) -> str:
    """The end of the prefix within `budget` tokens, starting on the step grid when possible."""
    n = len(side.lines)
    if n == 0 or budget <= 0:
        return ""
    suffix_sums = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix_sums[i] = suffix_sums[i + 1] + side.counts[i]
    grid = [i for i in range(0, n, step) if suffix_sums[i] <= budget]
    if grid:
        return "".join(side.lines[grid[0] :])
    lines = [i for i in range(n) if suffix_sums[i] <= budget]
    if lines:
        return "".join(side.lines[lines[0] :])
    return _cut_line_tail(side, budget, template)  # the cursor's own line is larger than the budget


def _head(side: _Side, budget: int, step: int, template: FimTemplate | None) -> str:
    """The start of the suffix within `budget` tokens, ending on the step grid when possible."""
    n = len(side.lines)
    if n == 0 or budget <= 0:
        return ""
    sums = [0]
    for count in side.counts:
        sums.append(sums[-1] + count)
    if sums[n] <= budget:
        return "".join(side.lines)
    grid = [e for e in range(step, n + 1, step) if sums[e] <= budget]
    if grid:
        return "".join(side.lines[: grid[-1]])
    ends = [e for e in range(1, n + 1) if sums[e] <= budget]
    if ends:
        return "".join(side.lines[: ends[-1]])
    return _cut_line_head(side, budget, template)


def _cut_line_tail(side: _Side, budget: int, template: FimTemplate | None) -> str:
    line = side.lines[-1]
    base = sum(map(len, side.lines[:-1]))
    starts = [o - base for o in side.offsets if o >= base]
    if len(starts) <= budget:
        return line
    cut = _outside_markers(line, starts[len(starts) - budget], template, forward=True)
    return line[cut:]


def _cut_line_head(side: _Side, budget: int, template: FimTemplate | None) -> str:
    line = side.lines[0]
    starts = [o for o in side.offsets if o < len(line)]
    if len(starts) <= budget:
        return line
    cut = _outside_markers(line, starts[budget], template, forward=False)
    return line[:cut]


def _outside_markers(text: str, cut: int, template: FimTemplate | None, forward: bool) -> int:
    """Move `cut` out of any special-token literal it would split (estimated offsets can land inside)."""
    for marker in template.special_tokens if template else ():
        start = text.find(marker)
        while start != -1:
            if start < cut < start + len(marker):
                return start + len(marker) if forward else start
            start = text.find(marker, start + 1)
    return cut


def _estimate_total(side: _Side) -> int:
    """Tokens of the whole side: counted where tokenized, extrapolated over what the pre-cut dropped."""
    if not side.dropped_chars:
        return side.tokens
    chars = sum(map(len, side.lines)) or 1
    return side.tokens + round(side.dropped_chars * side.tokens / chars)
