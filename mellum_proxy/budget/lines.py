"""Whole lines within a token budget: one side of the cursor, cut on a grid of lines, counted per line.

`LineCounts` remembers the token count of lines seen in earlier prompts (consecutive keystrokes change
one line), `precut` keeps only the text that could possibly fit, and `tail` / `head` take the end of the
prefix and the start of the suffix within a budget, starting (ending) on the step grid when they can; only
a single line larger than its budget is cut inside, at a token boundary, never inside a special token.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from mellum_proxy.budget.templates import FimTemplate
from mellum_proxy.budget.tokenizers import TokenCounter


class LineCounts:
    """Token counts of lines seen in earlier prompts, and the characters per token they showed.

    A line's count comes from a tokenization of the prompt it was in (so a token spanning two lines
    counts for the first); the final measurement of each prompt keeps the budget exact.
    """

    def __init__(self, size: int = 65_536) -> None:
        self.size = size
        self._counts: dict[str, int] = {}
        self._chars = 0
        self._tokens = 0

    def get(self, line: str) -> int | None:
        return self._counts.get(line)

    def estimate(self, line: str) -> int:
        """An unseen line's tokens on the safe side: a third more than the characters-per-token seen."""
        ratio = self._chars / self._tokens if self._tokens > 256 else 3.0
        return math.ceil(len(line) * 1.33 / ratio)

    def learn(self, lines: list[str], counts: list[int]) -> None:
        if len(self._counts) + len(lines) > self.size:
            self._counts.clear()
        for line, count in zip(lines, counts, strict=True):
            self._counts[line] = count
            self._chars += len(line)
            self._tokens += count

    def __len__(self) -> int:
        return len(self._counts)


@dataclass(slots=True)
class Side:
    """One side of the cursor, pre-cut and counted per line."""

    lines: list[str]
    counts: list[int]
    dropped_chars: int  # characters beyond the pre-cut, never looked at

    @property
    def tokens(self) -> int:
        return sum(self.counts)


def measured_side(offsets: list[int], at: int, text: str) -> Side:
    """`text`, found at `at` in a measured prompt whose tokens start at `offsets`: its lines, each counted as the
    prompt's tokenization split it (a token spanning two lines counts for the first)."""
    lines = text.splitlines(keepends=True)
    starts, position = [], at
    for line in lines:
        starts.append(position)
        position += len(line)
    low, high = bisect.bisect_left(offsets, at), bisect.bisect_left(offsets, position)
    counts = [0] * len(lines)
    for offset in offsets[low:high]:
        counts[bisect.bisect_right(starts, offset) - 1] += 1
    return Side(lines, counts, 0)


def kept_tokens(side: Side, kept: str, budget: int, from_end: bool) -> int:
    """The tokens of `kept`, which `tail` (`from_end`) or `head` took from `side` within `budget`: the counts of
    its whole lines, or `budget` for a part of one line (cut at that many tokens)."""
    total, size, lines = 0, 0, reversed(range(len(side.lines))) if from_end else range(len(side.lines))
    for i in lines:
        if size + len(side.lines[i]) > len(kept):
            break
        size += len(side.lines[i])
        total += side.counts[i]
    return total if size == len(kept) else budget


def precut(text: str, limit: int, step: int, from_end: bool) -> list[str]:
    """The lines of the largest grid-aligned run (at the end, or the start) within `limit` characters.

    The cut is found by characters, so only the kept text is split into lines; the line number of the
    cut (for the grid) is one count of newlines before it.
    """
    if len(text) <= limit:
        return text.splitlines(keepends=True)
    if from_end:
        newline = text.find("\n", len(text) - limit - 1)
        if newline == -1 or newline >= len(text) - 1:  # the last line alone is over the limit: keep it
            return text[text.rfind("\n", 0, len(text) - 1) + 1 :].splitlines(keepends=True)
        start = newline + 1
        lines = text[start:].splitlines(keepends=True)
        first = text.count("\n", 0, start)
        drop = min(-(-first // step) * step - first, len(lines) - 1)  # round the start up to the grid
        return lines[drop:]
    newline = text.rfind("\n", 0, limit)
    end = newline + 1 if newline != -1 else (text.find("\n") + 1 or len(text))
    lines = text[:end].splitlines(keepends=True)
    return lines[: max((len(lines) // step) * step, 1)]


async def tail(side: Side, budget: int, step: int, template: FimTemplate | None, counter: TokenCounter) -> str:
    """The end of the prefix within `budget` tokens, starting on the step grid when possible."""
    n = len(side.lines)
    if n == 0 or budget <= 0:
        return ""
    suffix_sums = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix_sums[i] = suffix_sums[i + 1] + side.counts[i]
    for i in range(0, n, step):
        if suffix_sums[i] <= budget:
            return "".join(side.lines[i:])
    for i in range(n):
        if suffix_sums[i] <= budget:
            return "".join(side.lines[i:])
    return await _cut_line_tail(side.lines[-1], budget, template, counter)  # the cursor's line is too long


async def head(side: Side, budget: int, step: int, template: FimTemplate | None, counter: TokenCounter) -> str:
    """The start of the suffix within `budget` tokens, ending on the step grid when possible."""
    n = len(side.lines)
    if n == 0 or budget <= 0:
        return ""
    sums = [0]
    for count in side.counts:
        sums.append(sums[-1] + count)
    if sums[n] <= budget:
        return "".join(side.lines)
    for end in range(n - n % step, 0, -step):
        if sums[end] <= budget:
            return "".join(side.lines[:end])
    for end in range(n, 0, -1):
        if sums[end] <= budget:
            return "".join(side.lines[:end])
    return await _cut_line_head(side.lines[0], budget, template, counter)


async def _cut_line_tail(line: str, budget: int, template: FimTemplate | None, counter: TokenCounter) -> str:
    starts = await counter.offsets(line)
    if len(starts) <= budget:
        return line
    cut = _outside_markers(line, starts[len(starts) - budget], template, forward=True)
    return line[cut:]


async def _cut_line_head(line: str, budget: int, template: FimTemplate | None, counter: TokenCounter) -> str:
    starts = await counter.offsets(line)
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


def estimate_total(side: Side) -> int:
    """Tokens of the whole side: counted where tokenized, extrapolated over what the pre-cut dropped."""
    if not side.dropped_chars:
        return side.tokens
    chars = sum(map(len, side.lines)) or 1
    return side.tokens + round(side.dropped_chars * side.tokens / chars)
