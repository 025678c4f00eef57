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
  keystrokes change one line); a side with many unseen lines is tokenized once, a few unseen lines
  are estimated on the safe side;
- the rendered prompt is measured once, exactly (`TokenCounter.measure`): that proves it fits, and
  teaches `LineCounts` the lines it holds. It is shrunk and measured again only when it does not fit.
With the upstream's `/tokenize` that is one round trip per completion; with a local tokenizer, none.

A prompt whose UTF-8 length (plus `SLACK_TOKENS`) is within the budget fits whatever the tokenizer,
so it is sent whole and not counted (the record's `tokenizer` says `bytes`, its token fields hold that
upper bound).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from mellum_proxy.budget.lines import LineCounts, Side, count_lines, estimate_total, head, learn, precut, tail
from mellum_proxy.budget.templates import PREFIX_ONLY, FimParts, FimTemplate, parse_any
from mellum_proxy.budget.tokenizers import CharsEstimator, NoPiecesError, TokenCounter
from mellum_proxy.errors import UpstreamError
from mellum_proxy.models import BudgetedPrompt, NormalizedRequest

log = logging.getLogger("mellum_proxy.budget")

PRECUT_CHARS_PER_TOKEN = 6  # code averages 3-4 characters a token; text beyond this is never looked at
MAX_SHRINK_ROUNDS = 8
SLACK_TOKENS = 8  # what a server may add to a prompt's own tokens (BOS, EOS, a leading space, FIM markers)
BOUND_METHOD = "bytes"  # the record's `tokenizer` when the prompt fitted by its length, uncounted
COLD_LINES = 4  # more unseen lines than this on one side: tokenize the side instead of estimating
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
        small = _fits_by_length(template, parts, prompt_budget, suffix_field)
        if small is not None:
            prompt, bound = small
            return BudgetedPrompt(
                prompt=prompt, suffix=parts.suffix if suffix_field else None, max_tokens=max_tokens,
                stops=self._stops(template), tokens_before=bound, tokens_after=bound, truncated=False,
                method=BOUND_METHOD, context_tokens=context_limit,
            )  # fmt: skip
        overhead = await self._overhead(template, parts.path, counter)
        available = max(0, prompt_budget - overhead)
        # The most each side could get: a token has at least one character, so characters bound the need.
        p_most, s_most = _split(available, settings.prefix_ratio, len(parts.prefix), len(parts.suffix))
        prefix = await self._side(parts.prefix, p_most, counter, lines, from_end=True)
        suffix = await self._side(parts.suffix, s_most, counter, lines, from_end=False)
        tokens_before = overhead + estimate_total(prefix) + estimate_total(suffix)
        p_budget, s_budget = _split(available, settings.prefix_ratio, prefix.tokens, suffix.tokens)
        context = parts.context
        for _ in range(MAX_SHRINK_ROUNDS):
            kept_prefix = await tail(prefix, p_budget, settings.step_lines, template, counter)
            kept_suffix = await head(suffix, s_budget, settings.step_lines, template, counter)
            fim = FimParts(kept_prefix, kept_suffix, parts.path, context)
            prompt, prefix_at, suffix_at = _render_spans(template, fim)
            total, offsets = await counter.measure(prompt)
            if counter.exact:
                learn(lines, offsets, ((prefix_at, kept_prefix), (suffix_at, kept_suffix)))
            if template is None and kept_suffix:
                total += len(await counter.offsets(kept_suffix))  # the suffix field, tokenized by the server
            if total <= prompt_budget:
                break
            if context:
                context = ""  # other files are dropped before any line of the current one
                continue
            if not counter.exact_count:
                break  # an estimate: nothing better to measure against
            if counter.exact:
                over = total - prompt_budget
                if p_budget >= s_budget:
                    p_budget = max(0, p_budget - over)
                else:
                    s_budget = max(0, s_budget - over)
            else:  # lines are counted by an estimate: shrink both sides by what the server's count says
                factor = SHRINK_MARGIN * max(0, prompt_budget - overhead) / max(1, total - overhead)
                p_budget, s_budget = int(p_budget * factor), int(s_budget * factor)
        return BudgetedPrompt(
            prompt=prompt,
            suffix=kept_suffix if suffix_field else None,
            max_tokens=max_tokens,
            stops=self._stops(template),
            tokens_before=max(tokens_before, total),
            tokens_after=total,
            truncated=(kept_prefix, kept_suffix, context) != (parts.prefix, parts.suffix, parts.context),
            method=counter.method,
            context_tokens=context_limit,
        )

    async def warm_up(self, request: NormalizedRequest) -> BudgetedPrompt | None:
        """What a cache-warming request (`n_predict: 0`) sends. One without text of its own (llama.vim's ring
        updates, llama.vscode's FIM_PREP) warms the start that the next completions will share: the other
        files it carries and the edited file's header, exactly as a completion renders them; None when there
        is nothing to warm (no other files, a template without file headers, or files that cannot fit)."""
        if request.prefix or request.suffix:
            return await self.apply(request)  # a prompt of its own to warm: all of it
        template = self.settings.template
        files = _context_files(template, request.context_files)
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
            files = _context_files(template, request.context_files)
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
            self._overheads[key] = await counter.count(_render(template, FimParts("", "", path)))
        return self._overheads[key]

    async def _side(self, text: str, budget: int, counter: TokenCounter, known: LineCounts, from_end: bool) -> Side:
        """Pre-cut `text` on the step grid to what could possibly fit, then count tokens per line."""
        lines = precut(text, max(1, budget) * PRECUT_CHARS_PER_TOKEN, self.settings.step_lines, from_end)
        seen = [known.get(line) for line in lines]
        unseen = [i for i, count in enumerate(seen) if count is None]
        if len(unseen) > COLD_LINES and counter.exact:
            counts = await count_lines(lines, counter)
            known.learn(lines, counts)
        else:
            counts = [count or 0 for count in seen]
            for i in unseen:
                counts[i] = known.estimate(lines[i]) if counter.exact else len(await counter.offsets(lines[i]))
        return Side(lines, counts, len(text) - sum(map(len, lines)))


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
    return _render_spans(template, parts)[0]


def _render_spans(template: FimTemplate | None, parts: FimParts) -> tuple[str, int, int]:
    """The prompt, and where the prefix and the suffix start in it (-1: the suffix is not in it)."""
    if template is None:
        return parts.context + parts.prefix, len(parts.context), -1  # the suffix, if any, is its own field
    return template.render_spans(parts)


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
