"""Discovery: what the proxy learns from the upstream, at start-up, once it is ready, and from the one
that serves after a failover; `UpstreamView` is that knowledge as one value every component reads.

At start-up llama.cpp may have its port open while it still loads the model (503 on `/health`): the
slot count and the `/tokenize` it answers then are not the server's. `Discovery.run` (a task
for the app's lifetime) waits until the upstream is healthy, asks again for what was left unsettled
(the slot count behind `max_concurrency = 0`, the tokenizer behind `tokenizer = auto`), reads the served
model's own tokenizer when it is on this machine (`mellum_proxy.budget.local`: about a second that holds the
interpreter's lock, so before, never after), decides the FIM template, warms the embedded server, and only
then says the proxy is `ready` (its `/health` answers ok from then on) in one block of lines. A GGUF whose
vocabulary was never cached is cached in a process of its own after that, for the next start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path

from mellum_proxy.budget import CharsEstimator, ContextBudget, UpstreamTokenizer
from mellum_proxy.budget.local import build_aside, find_local, needs_building, served_model_path
from mellum_proxy.budget.templates import PREFIX_ONLY, template_the_model_knows
from mellum_proxy.budget.tokenizers import (
    CountingTokenizer,
    NoPiecesError,
    TokenCounter,
    Tokenize,
    upstream_counter,
)
from mellum_proxy.errors import UpstreamError
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.sections import DiscoverySection
from mellum_proxy.serving import Policies
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.health import reachable
from mellum_proxy.upstream.servers import Found, discover, says_slots, slot_count

log = logging.getLogger("mellum_proxy")


RETRY_S = (0.25, 0.5, 1.0, 2.0)  # between health checks while the upstream is not ready (then every 2 s)
WARM_PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "


@dataclass(frozen=True, slots=True)
class UpstreamView:
    """What the proxy knows of the upstream that serves and how it fits prompts to it: one value, read by the
    ready block, `/status`, the plugins' discovery answers (`/api/show`'s `num_ctx`) and the llama.cpp
    answers' `generation_settings`."""

    url: str
    kind: str | None  # None: not reachable yet
    model: str | None
    context_tokens: int  # per request: the setting, lowered to the server's
    configured_context_tokens: int
    server_context_tokens: int | None
    slots: int  # requests upstream at once
    tokenizer: str
    exact: bool
    template: str
    template_why: str
    ready: bool


class Discovery:
    """Asks the upstream what it is, and applies the answer to the budget and the admission queue.

    Args:
        upstream: the primary upstream (what is asked until it is ready).
        section: what the settings say of it (`DiscoverySection`): `upstream_kind`, `upstream_model`, `max_concurrency`,
            `tokenizer`, whether `fim_template` was chosen.
    """

    def __init__(
        self,
        section: DiscoverySection,
        upstream: UpstreamClient,
        policies: Policies,
        budget: ContextBudget,
        embedded_model: Path | None = None,
        slots_known: bool = True,
        tokenize: Tokenize | None = None,
    ) -> None:
        self.section = section
        self.upstream = upstream
        self.tokenize = tokenize or upstream  # whose /tokenize counts: the one serving (`Upstreams`)
        self.counters: dict[str, TokenCounter] = {}  # by upstream URL, once found: taken back when it serves again
        self.policies = policies
        self.budget = budget
        self.embedded_model = embedded_model
        self.slots_known = slots_known
        self.found: Found | None = None  # what discovery found, once the upstream answered
        self.ready = asyncio.Event()  # the upstream answered and everything a completion depends on is decided
        self.settled = asyncio.Event()  # set once nothing is left to probe (for tests and `/status`)
        self.on_ready: Callable[[], None] | None = None  # says so, once
        self.template_decided = False
        self.template_why = "not checked: no tokenizer that counts exactly"
        self.configured_template = budget.settings.template  # what a new model's check starts from

    async def run(self) -> None:
        """Probe until settled; never raises (a failed probe leaves the current view)."""
        attempt = 0
        while not self.ready.is_set() and not await self._probe():
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1
        await self.prepare()
        if self.section.tokenizer == "auto" and self.upstream.base_url not in self.counters:
            model = self.embedded_model or await served_model_path(self.upstream)
            if model is not None and needs_building(model):
                await build_aside(model)  # in a process of its own: read from the next start on
                log.info("tokenizer: cached %s's vocabulary; the proxy counts with it from its next start", model.name)
        self.settled.set()

    async def prepare(self) -> None:
        """Once the upstream answers: find the local tokenizer, decide the template, warm the embedded server,
        say the proxy is ready. What holds the interpreter's lock (reading a tokenizer) is done here, before the
        proxy answers, not after."""
        if self.ready.is_set():
            return
        if self.section.tokenizer == "auto":
            counter = self.budget.counter
            server = counter if isinstance(counter, UpstreamTokenizer | CountingTokenizer) else None
            server = server or await upstream_counter(self.tokenize, self.upstream.model)
            local = await find_local(self.upstream, self.embedded_model, server.ids if server else None)
            if local is not None:
                self._switch_tokenizer(local, "agrees with the upstream's /tokenize")
                self.counters[self.upstream.base_url] = local
        await self.check_template()
        if self.embedded_model is not None:
            await self._warm()
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready()

    async def _warm(self) -> None:
        """One short completion on the embedded server before it is called ready: llama.cpp's first decode
        (weights paged in, buffers allocated) took 3 s of the first keystroke's time once."""
        request = NormalizedRequest(id="warm-up", route="internal", session="warm-up", prefix=WARM_PROMPT,
                                    suffix="", max_tokens=4)  # fmt: skip
        started = asyncio.get_running_loop().time()
        try:
            prompt = await self.budget.apply(request)
            async with aclosing(self.upstream.stream_completion(request, prompt)) as batches:
                async for _ in batches:
                    pass
        except UpstreamError as exc:
            log.debug("warm-up completion failed: %s", exc.type)
            return
        log.debug("warm-up completion: %.0f ms", (asyncio.get_running_loop().time() - started) * 1000)

    async def check_template(self) -> None:
        """With an exact tokenizer: use a FIM template whose markers the model has as tokens of their own
        (the packaged gemma-3-270m has none: it gets prefix-only prompts). A template the user chose is
        kept, with a warning when the model does not know its markers. Decided once."""
        counter, template = self.budget.counter, self.budget.settings.template
        if self.template_decided or template is None or template is PREFIX_ONLY:
            return
        if not counter.exact_count:
            return
        try:
            empty = await counter.count("")  # what a count adds to any text (BOS), asked once
        except UpstreamError:
            return

        async def single_token(marker: str) -> bool:
            try:
                if counter.exact:
                    try:
                        return len(await counter.offsets(marker)) == 1
                    except NoPiecesError:  # pieces it cannot place (byte fallback): its count still says
                        pass
                return await counter.count(marker) - empty == 1
            except UpstreamError:
                return True  # cannot tell: assume it does

        known = await template_the_model_knows(template, single_token)
        self.template_decided = True
        if known is template:
            self.template_why = "the model has its markers as tokens"
        elif self.section.fim_template_chosen:
            log.warning("FIM template %s: the model has no token for its markers %s; it will read them as text",
                        template.name, ", ".join(template.markers))  # fmt: skip
            self.template_why = "set; the model has no token for its markers"
        else:
            self.template_why = f"the model has no token for {', '.join(template.markers)}"
            self.template_why = f"{template.name} -> {known.name}: {self.template_why}"
            self.budget.use_template(known)
        chosen = self.budget.settings.template
        log.debug("FIM template: %s (%s)", chosen.name if chosen else "none", self.template_why)

    async def _probe(self) -> bool:
        """One round: True when the upstream was ready and everything left open is now known."""
        if not await reachable(self.upstream):
            return False
        if self.found is None or self.found.model is None or self.found.context is None:
            self.apply(await discover(self.upstream, self.section.upstream_kind))  # again, now that it is ready
        if not self.slots_known:
            slots = await slot_count(self.upstream)
            if slots is None:
                return False
            self._use_slots(slots)
        if self.section.tokenizer == "auto" and isinstance(self.budget.counter, CharsEstimator):
            tokenizer = await upstream_counter(self.tokenize, self.upstream.model)
            if tokenizer is None:
                return True  # ready, but without a /tokenize: `chars` stays
            self._switch_tokenizer(tokenizer, "the upstream answers /tokenize")
        return True

    def apply(self, found: Found) -> None:
        """Use what discovery found: the model to name, the context to fit, the slots to fill."""
        previous, self.found = self.found, found
        settings = self.section
        if settings.upstream_model is None and found.model is not None and self.upstream.model != found.model:
            self.upstream.model = found.model
        if self.budget.fit(found.context):
            budget = self.budget
            self._say("context budget: %d tokens (max_context_tokens %d; the upstream's per request: %s)",
                      budget.settings.max_context_tokens, budget.configured_context, found.context)  # fmt: skip
        if settings.max_concurrency == 0 and found.slots is not None:
            self._use_slots(found.slots)
        elif not says_slots(found.kind):
            self.slots_known = True  # only some kinds say; the others keep the setting (or 1)
        if found != previous:
            self._say("upstream %s: %s", self.upstream.shown_url, found.describe())

    async def rediscover(self) -> bool:
        """Ask the primary again what it is (it restarted, or came back): a server back with another model or
        context is followed without restarting the proxy: its context, slots, and for another model its
        tokenizer (its `/tokenize`: a local one is read at the next start, since reading one holds the
        interpreter's lock) and FIM template, said once. True when something changed."""
        try:
            found = await discover(self.upstream, self.section.upstream_kind)
        except UpstreamError:
            return False
        previous = self.found
        if found == previous:
            return False
        if self.section.upstream_model is None and previous is not None and found.model != previous.model:
            self.upstream.model = found.model
            if self.section.tokenizer == "auto":
                counter = await upstream_counter(self.tokenize, found.model)
                self.budget.use(counter or CharsEstimator())
                self.counters.pop(self.upstream.base_url, None)
            self.budget.use_template(self.configured_template)
            self.template_decided = False
            await self.check_template()
        self.apply(found)  # its context and slots; one line says what it is now
        return True

    async def follow(self, client: UpstreamClient) -> None:
        """Serve from `client` now (a failover, or the first one back): its model, its context per request,
        its slots and its tokenizer, not the primary's (a fallback once ran at the primary's concurrency of
        1 for good)."""
        kind = self.section.upstream_kind if client is self.upstream else "auto"
        found = await discover(client, kind)
        if self.section.upstream_model is None and found.model is not None:
            client.model = found.model
        self.budget.fit(found.context)
        if self.section.max_concurrency == 0:
            slots = found.slots or 1
            if slots != self.policies.admission.limit:
                self.policies.admission.resize(slots)
        if self.section.tokenizer == "auto":
            counter = self.counters.get(client.base_url) or await upstream_counter(self.tokenize, client.model)
            self.budget.use(counter or CharsEstimator())
            if counter is not None:
                self.counters[client.base_url] = counter
        log.info("serving from %s: %s; %d upstream at once, %d tokens a request, tokenizer %s", client.shown_url,
                 found.describe(), self.policies.admission.limit, self.budget.settings.max_context_tokens,
                 self.budget.counter.method)  # fmt: skip

    @property
    def view(self) -> UpstreamView:
        found, budget = self.found, self.budget
        template = budget.settings.template
        return UpstreamView(
            url=self.upstream.shown_url, kind=found.kind if found else None, model=self.upstream.model,
            context_tokens=budget.settings.max_context_tokens, configured_context_tokens=budget.configured_context,
            server_context_tokens=found.context if found else None, slots=self.policies.admission.limit,
            tokenizer=budget.counter.method, exact=budget.counter.exact_count,
            template=template.name if template else "none", template_why=self.template_why, ready=self.ready.is_set(),
        )  # fmt: skip

    def _say(self, message: str, *args: object) -> None:
        """A change of the proxy's view: a line of its own once the ready block has been said, else part of it."""
        log.log(logging.INFO if self.ready.is_set() else logging.DEBUG, message, *args)

    def _use_slots(self, slots: int) -> None:
        self.slots_known = True
        if slots != self.policies.admission.limit:
            self._say("upstream: max_concurrency %d -> %d (its slots)", self.policies.admission.limit, slots)
            self.policies.admission.resize(slots)

    def _switch_tokenizer(self, counter: TokenCounter, why: str, quiet: bool = True) -> None:
        """Count with `counter` from now on; said at once (`quiet=False`) only after the ready block."""
        log.log(logging.DEBUG if quiet else logging.INFO, "upstream: tokenizer %s -> %s (%s)",
                self.budget.counter.method, counter.method, why)  # fmt: skip
        self.budget.use(counter)
