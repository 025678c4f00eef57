"""`ContextBudget`: fit a request into `max_context_tokens`, nearest the cursor, in stable steps.

For a fill-in-the-middle request the prompt budget (`max_context_tokens - max_tokens`, less the
template's own tokens) is split between prefix and suffix by `prefix_ratio`; budget one side does not
need goes to the other. Whole lines are dropped from the far end of the prefix and of the suffix. The
window edges move on a grid of `step_lines` lines, so consecutive keystrokes send the same start of
prompt and the server's prompt cache keeps matching. Only a single line larger than its budget is cut
inside, at a token boundary (never inside a character or a special token).

The work per keystroke is small and does not grow with the file:
- each side is pre-cut by characters before it is split into lines (the far text is never touched);
- lines are counted from `LineCounts`, the token counts of lines seen in earlier prompts (consecutive
  keystrokes change one line); a few unseen lines are estimated on the safe side;
- the rendered prompt is measured once, exactly (`TokenCounter.measure`): that proves it fits, and its
  token offsets count every line it holds (`LineCounts` learns them). A prompt over the budget is cut by
  those counts, with `EDGE_TOKENS` at each edge the cut moves, and not measured again. A cold document (many
  unseen lines, or a file the template's own tokens were never counted with) measures all that could fit.
With the upstream's `/tokenize` that is one round trip per completion, a cold one included (template `none`
sends the suffix as a field of its own, which the server tokenizes apart: one more); with a local tokenizer,
none.

A prompt whose UTF-8 length (plus `SLACK_TOKENS`) is within the budget fits whatever the tokenizer,
so it is sent whole and not counted (the record's `tokenizer` says `bytes`, its token fields hold that
upper bound).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from dataclasses import dataclass

from mellum_proxy.budget.lines import LineCounts, Side, estimate_total, head, kept_tokens, measured_side, precut, tail
from mellum_proxy.budget.rendering import SLACK_TOKENS, context_files, fits_by_length, render, render_spans, split
from mellum_proxy.budget.templates import PREFIX_ONLY, FimParts, FimTemplate, parse_any
from mellum_proxy.budget.tokenizers import CharsEstimator, NoPiecesError, TokenCounter
from mellum_proxy.errors import UpstreamError
from mellum_proxy.models import BudgetedPrompt, NormalizedRequest

log = logging.getLogger("mellum_proxy.budget")

PRECUT_CHARS_PER_TOKEN = 6  # code averages 3-4 characters a token; text beyond this is never looked at
MAX_SHRINK_ROUNDS = 8
BOUND_METHOD = "bytes"  # the record's `tokenizer` when the prompt fitted by its length, uncounted
COLD_LINES = 4  # more unseen lines than this on one side: measure all that could fit instead of estimating
EDGE_TOKENS = 2  # a cut line may tokenize apart from where it was counted, at each edge the cut moves
REFIT_SQUEEZE = 0.9  # of the budget, times planned / counted, for a prompt the server refused as too long
SHRINK_MARGIN = 0.95  # a prompt counted over its budget by a server whose token starts are unknown shrinks a bit more


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    max_context_tokens: int = 2048
    max_tokens: int = 128
    prefix_ratio: float = 0.75
    step_lines: int = 16
    template: FimTemplate | None = None  # None: send prompt and suffix as fields ("none")
    stops: tuple[str, ...] = ()  # ends every completion besides the template's own (a blank line: `stop_at_blank_line`)

    @classmethod
    def of(cls, section: object) -> BudgetSettings:
        """From the budget's section, each field from the one of its name (no mapping to keep in step)."""
        return cls(**{spec.name: getattr(section, spec.name) for spec in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class Fitted:
    """A fitted prompt, the parts it kept, and its tokens before and after."""

    prompt: str
    prefix: str
    suffix: str
    context: str
    tokens_before: int
    tokens: int


class ContextBudget:
    def __init__(self, settings: BudgetSettings, counter: TokenCounter) -> None:
        self.settings = settings
        self.counter = counter
        self.lines = LineCounts()
        self._fallback = CharsEstimator()
        self.configured_context = settings.max_context_tokens  # the setting; the server's may lower it
        self._overheads: dict[tuple[str, str | None, str | None], int] = {}

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        """Calibration from the upstream's reported `usage.prompt_tokens`."""
        self.counter.observe(prompt, prompt_tokens)
        self._fallback.observe(prompt, prompt_tokens)

    def fit(self, server_context: int | None) -> bool:
        """Plan for the serving upstream: the setting, lowered to its context per request when it says one
        (llama.cpp splits `-c` over its slots), never past it; whether that changed the budget."""
        target = min(self.configured_context, server_context) if server_context else self.configured_context
        if target == self.settings.max_context_tokens:
            return False
        self.settings = dataclasses.replace(self.settings, max_context_tokens=target)
        self._overheads.clear()
        return True

    def use_template(self, template: FimTemplate | None) -> None:
        """Render with `template` from now on (the model's vocabulary asked for another)."""
        self.settings = dataclasses.replace(self.settings, template=template)
        self._overheads.clear()

    def use(self, counter: TokenCounter) -> None:
        """Count with `counter` from now on (a better tokenizer became available)."""
        self.counter = counter
        self.lines = LineCounts()

    async def apply(self, request: NormalizedRequest, squeeze: float = 1.0) -> BudgetedPrompt:
        """Fit `request` into the budget (`squeeze` times its prompt budget). An upstream tokenizer that fails
        falls back to `chars`."""
        try:
            return await self._apply(request, self.counter, self.lines, squeeze)
        except NoPiecesError as exc:
            log.warning("tokenizer %s: %s; estimating from characters from now on", self.counter.method, exc)
            self.use(self._fallback)  # for good: asking again would fail the same way on every keystroke
            return await self._apply(request, self.counter, self.lines, squeeze)
        except UpstreamError as exc:
            # the upstream's message is not logged: a tokenizer's error may quote the text it was sent
            why = f"{exc.type}, HTTP {exc.upstream_status}"
            log.warning("tokenizer %s failed (%s); estimating from characters", self.counter.method, why)
            return await self._apply(request, self._fallback, LineCounts(), squeeze)

    async def refit(self, request: NormalizedRequest, refused: BudgetedPrompt, counted: int) -> BudgetedPrompt:
        """`request` again, after the server refused `refused` as over its context, having counted `counted`
        prompt tokens (0: it did not say): learn from the count, and fit harder."""
        if counted > 0:
            self.observe(refused.prompt, counted)
        planned = max(1, refused.tokens_after)
        squeeze = min(REFIT_SQUEEZE, REFIT_SQUEEZE * planned / counted) if counted > planned else REFIT_SQUEEZE / 2
        log.warning("context budget: the upstream counted %s prompt tokens where %d were planned (tokenizer %s); "
                    "fitting again to %d%% of the budget", counted or "more", planned, refused.method,
                    round(squeeze * 100))  # fmt: skip
        return await self.apply(request, squeeze)

    def context_limit(self, request: NormalizedRequest) -> int:
        """The context per request `request` is fitted to: the one discovered value (the setting, lowered to
        the server's context per request), or the client's own smaller limit (Ollama `num_ctx`)."""
        limit = self.settings.max_context_tokens
        return min(limit, request.context_tokens or limit)

    async def _apply(
        self, request: NormalizedRequest, counter: TokenCounter, lines: LineCounts, squeeze: float = 1.0
    ) -> BudgetedPrompt:
        settings = self.settings
        cap = settings.max_tokens
        max_tokens = cap if request.max_tokens is None else min(request.max_tokens, cap)
        context_limit = self.context_limit(request)
        if request.edit_region is not None:  # the client built and sized it around its region: as it came
            bound = len(request.prefix.encode()) + SLACK_TOKENS
            return BudgetedPrompt(
                prompt=request.prefix, suffix=None, max_tokens=max_tokens, stops=(), tokens_before=bound,
                tokens_after=bound, truncated=False, method=BOUND_METHOD, context_tokens=context_limit,
            )  # fmt: skip
        prompt_budget = max(1, int((context_limit - max_tokens) * squeeze))
        parts, template, suffix_field = self._parts(request)
        small = fits_by_length(template, parts, prompt_budget, suffix_field)
        if small is not None:
            prompt, bound = small
            return BudgetedPrompt(
                prompt=prompt, suffix=parts.suffix if suffix_field else None, max_tokens=max_tokens,
                stops=self._stops(template), tokens_before=bound, tokens_after=bound, truncated=False,
                method=BOUND_METHOD, context_tokens=context_limit,
            )  # fmt: skip
        fit = self._measured_once if counter.exact else self._measured_until_fits
        done = await fit(parts, template, prompt_budget, counter, lines)
        return BudgetedPrompt(
            prompt=done.prompt,
            suffix=done.suffix if suffix_field else None,
            max_tokens=max_tokens,
            stops=self._stops(template),
            tokens_before=max(done.tokens_before, done.tokens),
            tokens_after=done.tokens,
            truncated=(done.prefix, done.suffix, done.context) != (parts.prefix, parts.suffix, parts.context),
            method=counter.method,
            context_tokens=context_limit,
        )

    async def _measured_once(
        self, parts: FimParts, template: FimTemplate | None, budget: int, counter: TokenCounter, known: LineCounts
    ) -> Fitted:
        """Fit with one measurement (one `/tokenize` with the server's tokenizer). It proves the prompt fits, or
        its token offsets count every line the prompt holds, and the prompt is cut by those counts, with
        `EDGE_TOKENS` at each edge the cut moves, and not measured again. A cold document (many lines never
        counted, or a file new to the template's own count) measures all that could possibly fit."""
        settings, step = self.settings, self.settings.step_lines
        key = (counter.method, template.name if template else None, parts.path)
        own = self._overheads.get(key)
        p_most, s_most = split(budget, settings.prefix_ratio, len(parts.prefix), len(parts.suffix))
        prefix, p_unseen = self._known_side(parts.prefix, p_most, known, from_end=True)
        suffix, s_unseen = self._known_side(parts.suffix, s_most, known, from_end=False)
        if own is None or max(p_unseen, s_unseen) > COLD_LINES:
            kept_prefix, kept_suffix = "".join(prefix.lines), "".join(suffix.lines)
        else:
            p_budget, s_budget = split(max(0, budget - own), settings.prefix_ratio, prefix.tokens, suffix.tokens)
            kept_prefix = await tail(prefix, p_budget, step, template, counter)
            kept_suffix = await head(suffix, s_budget, step, template, counter)
        context = parts.context
        prompt, prefix_at, suffix_at = render_spans(template, FimParts(kept_prefix, kept_suffix, parts.path, context))
        total, offsets = await counter.measure(prompt)
        measured_prefix = measured_side(offsets, prefix_at, kept_prefix)
        measured_suffix = measured_side(offsets, suffix_at, kept_suffix) if suffix_at >= 0 else Side([], [], 0)
        context_tokens = bisect.bisect_left(offsets, len(context)) if context else 0  # the context comes first
        own = total - measured_prefix.tokens - measured_suffix.tokens - context_tokens  # the template's, and BOS
        if len(self._overheads) > 1024:
            self._overheads.clear()
        self._overheads[key] = own
        if template is None and kept_suffix:  # the suffix field: the server tokenizes it apart
            measured_suffix = measured_side(await counter.offsets(kept_suffix), 0, kept_suffix)
            total += measured_suffix.tokens
        for side in (measured_prefix, measured_suffix):
            known.learn(side.lines, side.counts)
        sides = estimate_total(_recounted(prefix, known)) + estimate_total(_recounted(suffix, known))
        before = own + context_tokens + sides
        if total <= budget:
            return Fitted(prompt, kept_prefix, kept_suffix, context, before, total)
        if context:  # other files are dropped before any line of the current one
            context, total = "", total - context_tokens + EDGE_TOKENS
            if total <= budget:
                prompt = render(template, FimParts(kept_prefix, kept_suffix, parts.path))
                if not counter.round_trip:
                    total = (await counter.measure(prompt))[0]
                return Fitted(prompt, kept_prefix, kept_suffix, context, before, total)
        room = max(0, budget - own - 2 * EDGE_TOKENS)
        p_budget, s_budget = split(room, settings.prefix_ratio, measured_prefix.tokens, measured_suffix.tokens)
        kept_prefix = await tail(measured_prefix, p_budget, step, template, counter)
        kept_suffix = await head(measured_suffix, s_budget, step, template, counter)
        prompt = render(template, FimParts(kept_prefix, kept_suffix, parts.path))
        if not counter.round_trip:  # a local tokenizer: counting again costs no request, and the record is exact
            return Fitted(prompt, kept_prefix, kept_suffix, context, before, (await counter.measure(prompt))[0])
        total = own + 2 * EDGE_TOKENS + kept_tokens(measured_prefix, kept_prefix, p_budget, from_end=True)
        total += kept_tokens(measured_suffix, kept_suffix, s_budget, from_end=False)
        return Fitted(prompt, kept_prefix, kept_suffix, context, before, total)

    async def _measured_until_fits(
        self, parts: FimParts, template: FimTemplate | None, budget: int, counter: TokenCounter, known: LineCounts
    ) -> Fitted:
        """Fit by an estimate of each line (`chars`, or a server that counts without saying where its tokens
        start): each rendered prompt is measured, and shrunk until the count fits (one round for `chars`)."""
        settings = self.settings
        overhead = await self._overhead(template, parts.path, counter)
        available = max(0, budget - overhead)
        # The most each side could get: a token has at least one character, so characters bound the need.
        p_most, s_most = split(available, settings.prefix_ratio, len(parts.prefix), len(parts.suffix))
        prefix = await self._side(parts.prefix, p_most, counter, from_end=True)
        suffix = await self._side(parts.suffix, s_most, counter, from_end=False)
        tokens_before = overhead + estimate_total(prefix) + estimate_total(suffix)
        p_budget, s_budget = split(available, settings.prefix_ratio, prefix.tokens, suffix.tokens)
        context = parts.context
        for _ in range(MAX_SHRINK_ROUNDS):
            kept_prefix = await tail(prefix, p_budget, settings.step_lines, template, counter)
            kept_suffix = await head(suffix, s_budget, settings.step_lines, template, counter)
            prompt = render(template, FimParts(kept_prefix, kept_suffix, parts.path, context))
            total = (await counter.measure(prompt))[0]
            if template is None and kept_suffix:
                total += len(await counter.offsets(kept_suffix))  # the suffix field, tokenized by the server
            if total <= budget:
                break
            if context:
                context = ""  # other files are dropped before any line of the current one
                continue
            if not counter.exact_count:
                break  # an estimate: nothing better to measure against
            # lines are counted by an estimate: shrink both sides by what the server's count says
            factor = SHRINK_MARGIN * max(0, budget - overhead) / max(1, total - overhead)
            p_budget, s_budget = int(p_budget * factor), int(s_budget * factor)
        return Fitted(prompt, kept_prefix, kept_suffix, context, tokens_before, total)

    async def warm_up(self, request: NormalizedRequest) -> BudgetedPrompt | None:
        """What a cache-warming request (`n_predict: 0`) sends. One without text of its own (llama.vim's ring
        updates, llama.vscode's FIM_PREP) warms the start that the next completions will share: the other
        files it carries and the edited file's header, exactly as a completion renders them; None when there
        is nothing to warm (no other files, a template without file headers, or files that cannot fit)."""
        if request.prefix or request.suffix:
            return await self.apply(request)  # a prompt of its own to warm: all of it
        template = self.settings.template
        files = context_files(template, request.context_files)
        if template is None or not files:
            return None
        path = request.file_path if request.file_path is not None else ""
        prompt = files + template.header.replace("{path}", path)
        budget = self.context_limit(request) - self.settings.max_tokens
        try:
            tokens = await self.counter.count(prompt) if len(prompt) + SLACK_TOKENS > budget else len(prompt)
        except UpstreamError:
            return None
        if tokens > budget:
            return None  # a completion drops these files first: warming them would waste the slot
        return BudgetedPrompt(prompt=prompt, suffix=None, max_tokens=0, stops=(), tokens_before=tokens,
                              tokens_after=tokens, truncated=False, method=self.counter.method,
                              context_tokens=self.context_limit(request))  # fmt: skip

    def _stops(self, template: FimTemplate | None) -> tuple[str, ...]:
        return (template.stops if template else ()) + self.settings.stops

    def _parts(self, request: NormalizedRequest) -> tuple[FimParts, FimTemplate | None, bool]:
        """The parts to fit, the template to render them with, and whether the suffix travels as a field."""
        template = self.settings.template
        if request.suffix is not None:
            files = context_files(template, request.context_files)
            suffix = "" if template is PREFIX_ONLY else request.suffix  # it has no place for one
            # After other files, the edited file starts with a header of its own: its name when the client
            # said it, else an empty name, so no other file's name (or text) is taken for the edited file's.
            path = request.file_path if request.file_path is not None or not files else ""
            return FimParts(request.prefix, suffix, path, files), template, template is None
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
            self._overheads[key] = await counter.count(render(template, FimParts("", "", path)))
        return self._overheads[key]

    def _known_side(self, text: str, budget: int, known: LineCounts, from_end: bool) -> tuple[Side, int]:
        """Pre-cut `text` on the step grid to what could possibly fit; each line counted as seen before, or
        estimated on the safe side; and how many lines were never seen."""
        lines = precut(text, max(1, budget) * PRECUT_CHARS_PER_TOKEN, self.settings.step_lines, from_end)
        counts, unseen = [], 0
        for line in lines:
            count = known.get(line)
            if count is None:
                unseen, count = unseen + 1, known.estimate(line)
            counts.append(count)
        return Side(lines, counts, len(text) - sum(map(len, lines))), unseen

    async def _side(self, text: str, budget: int, counter: TokenCounter, from_end: bool) -> Side:
        """Pre-cut `text` on the step grid to what could possibly fit, each line counted by the estimate."""
        lines = precut(text, max(1, budget) * PRECUT_CHARS_PER_TOKEN, self.settings.step_lines, from_end)
        counts = [len(await counter.offsets(line)) for line in lines]
        return Side(lines, counts, len(text) - sum(map(len, lines)))


def _recounted(side: Side, known: LineCounts) -> Side:
    """`side` with each line's count as `known` has it now (a measurement taught it lines it had estimated)."""
    counts = [known.get(line) or count for line, count in zip(side.lines, side.counts, strict=True)]
    return Side(side.lines, counts, side.dropped_chars)
