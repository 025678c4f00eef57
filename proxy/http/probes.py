"""What the proxy learns from the upstream, at start-up and again once it is ready.

At start-up llama.cpp may have its port open while it still loads the model (503 on `/health`): the
slot count and the `/tokenize` it answers then are not the server's. `UpstreamProbes.run` (a task
for the app's lifetime) waits until the upstream is healthy, asks again for what was left unsettled
(the slot count behind `max_concurrency = 0`, the tokenizer behind `tokenizer = auto`), and then
looks for an exact local tokenizer (`proxy.budget.local`). Every change of the proxy's view of the
server is one log line.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from proxy.budget import CharsEstimator, ContextBudget, UpstreamTokenizer
from proxy.budget.local import find_local
from proxy.budget.templates import PREFIX_ONLY, template_the_model_knows
from proxy.budget.tokenizers import upstream_tokenizer_usable
from proxy.completion import Policies
from proxy.config import Settings
from proxy.errors import UpstreamError
from proxy.upstream import UpstreamClient
from proxy.upstream.kinds import Found, discover

log = logging.getLogger("mellum_proxy")

RETRY_S = (0.25, 0.5, 1.0, 2.0)  # between health checks while the upstream is not ready (then every 2 s)


class UpstreamProbes:
    def __init__(
        self,
        settings: Settings,
        upstream: UpstreamClient,
        policies: Policies,
        budget: ContextBudget,
        embedded_model: Path | None = None,
        slots_known: bool = True,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.policies = policies
        self.budget = budget
        self.embedded_model = embedded_model
        self.slots_known = slots_known
        self.found: Found | None = None  # what discovery found, once the upstream answered
        self.settled = asyncio.Event()  # set once nothing is left to probe (for tests and `/status`)

    async def run(self) -> None:
        """Probe until settled; never raises (a failed probe leaves the current view)."""
        attempt = 0
        while not await self._probe():
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1
        if self.settings.tokenizer == "auto":
            local = await find_local(self.upstream, self.embedded_model)
            if local is not None:
                self._switch_tokenizer(local, "agrees with the upstream's /tokenize")
        await self._check_template()
        self.settled.set()

    async def _check_template(self) -> None:
        """With an exact tokenizer: use a FIM template whose markers the model has as tokens of their own
        (the packaged gemma-3-270m has none: it gets prefix-only prompts). A template the user chose is
        kept, with a warning when the model does not know its markers."""
        counter, template = self.budget.counter, self.budget.settings.template
        if not counter.exact or template is None or template is PREFIX_ONLY:
            return

        async def single_token(marker: str) -> bool:
            try:
                return len(await counter.offsets(marker)) == 1
            except UpstreamError:
                return True  # cannot tell: assume it does

        known = await template_the_model_knows(template, single_token)
        if known is template:
            log.info("FIM template: %s (the model has its markers as tokens)", template.name)
        elif "fim_template" in self.settings.model_fields_set:
            log.warning("FIM template %s: the model has no token for its markers %s; it will read them as text",
                        template.name, ", ".join(template.markers))  # fmt: skip
        else:
            log.info("FIM template: %s -> %s (the model has no token for %s)", template.name, known.name,
                     ", ".join(template.markers))  # fmt: skip
            self.budget.use_template(known)

    async def _probe(self) -> bool:
        """One round: True when the upstream was ready and everything left open is now known."""
        if not await self.upstream.reachable():
            return False
        if self.found is None or self.found.model is None or self.found.context is None:
            self.apply(await discover(self.upstream, self.settings.upstream_kind))  # again, now that it is ready
        if not self.slots_known:
            slots = await self.upstream.slot_count()
            if slots is None:
                return False
            self._use_slots(slots)
        if self.settings.tokenizer == "auto" and isinstance(self.budget.counter, CharsEstimator):
            tokenizer = UpstreamTokenizer(self.upstream)
            if not await upstream_tokenizer_usable(tokenizer):
                return True  # ready, but without a /tokenize that can cut: `chars` stays
            self._switch_tokenizer(tokenizer, "the upstream answers /tokenize")
        return True

    def apply(self, found: Found) -> None:
        """Use what discovery found: the model to name, the context to fit, the slots to fill."""
        previous, self.found = self.found, found
        settings = self.settings
        if settings.upstream_model is None and found.model is not None and self.upstream.model != found.model:
            self.upstream.model = found.model
        if found.context is not None:
            self.budget.clamp(found.context)
        if settings.max_concurrency == 0 and found.slots is not None:
            self._use_slots(found.slots)
        elif found.kind != "llama.cpp":
            self.slots_known = True  # only llama.cpp says; the others keep the setting (or 1)
        if found != previous:
            log.info("upstream %s: %s", self.upstream.shown_url, found.describe())

    def _use_slots(self, slots: int) -> None:
        self.slots_known = True
        if slots != self.policies.admission.limit:
            log.info("upstream: max_concurrency %d -> %d (its slots)", self.policies.admission.limit, slots)
            self.policies.admission.resize(slots)

    def _switch_tokenizer(self, counter: object, why: str) -> None:
        log.info("upstream: tokenizer %s -> %s (%s)", self.budget.counter.method, counter.method, why)  # type: ignore[attr-defined]
        self.budget.use(counter)  # type: ignore[arg-type]
