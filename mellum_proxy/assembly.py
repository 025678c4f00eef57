"""The composition root: the completion core built from the settings' sections.

The HTTP edge (`mellum_proxy.http.lifecycle`), the policy lab (`mellum_proxy.bench.runners.lab`) and the tests
build the core the same way: `build_policies`, `budget_settings` and `build_counter` from their sections,
`UpstreamClient`s with `upstream_clients`, and `build_core` for the service and its discovery.
Nothing here knows HTTP servers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from mellum_proxy.budget import (
    BudgetSettings,
    CharsEstimator,
    ContextBudget,
    TokenCounter,
    UpstreamTokenizer,
    template_for,
)
from mellum_proxy.budget.gguf_vocab import UnsupportedVocabulary
from mellum_proxy.budget.local import load_local
from mellum_proxy.budget.tokenizers import Tokenize, upstream_counter
from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.completion import CompletionService, Policies
from mellum_proxy.discovery import Discovery, DiscoveryKnobs
from mellum_proxy.flight import CompletionSource
from mellum_proxy.policies import AdmissionQueue, Debouncer, Dispatch, Supersede
from mellum_proxy.policies.reuse import ReuseCache
from mellum_proxy.sections import BudgetSection, PolicySection, Sections, UpstreamSection
from mellum_proxy.telemetry import Telemetry
from mellum_proxy.upstream import UpstreamClient

log = logging.getLogger("mellum_proxy")


def build_policies(section: PolicySection, slots: int | None = None, clock: Clock = LOOP_CLOCK) -> Policies:
    """The policies; `max_concurrency = 0` takes the upstream's `slots` (1 while unknown)."""
    limit = section.max_concurrency
    if limit == 0:
        limit = slots or 1
        why = f"the upstream's {slots} slots" if slots else "1 until the upstream says how many slots it has"
        log.debug("max_concurrency: %s", why)
    fixed = section.dispatch == "fixed"
    dispatch = None if fixed else Dispatch(section.hold_idle_max_s, section.hold_busy_max_s,
                                           section.hold_gap_factor, clock, section.hold_min_s)  # fmt: skip
    return Policies(
        debouncer=Debouncer(section.debounce_s if fixed else 0.0, clock),
        supersede=Supersede(section.max_inflight),
        admission=AdmissionQueue(limit, section.max_queue),
        ttft_timeout_s=section.ttft_timeout_s,
        timeout_s=section.timeout_s,
        complete_in_comments=section.complete_in_comments,
        postprocess=section.postprocess,
        clock=clock,
        dispatch=dispatch,
        reuse=ReuseCache() if section.reuse else None,
        keep_prefill=section.keep_prefill,
    )


def budget_settings(section: BudgetSection) -> BudgetSettings:
    return BudgetSettings(
        max_context_tokens=section.max_context_tokens,
        max_tokens=section.max_tokens,
        prefix_ratio=section.prefix_ratio,
        step_lines=section.step_lines,
        template=template_for(section.fim_template),
        stops=("\n\n",) if section.stop_at_blank_line else (),
    )


async def build_counter(section: BudgetSection, upstream: Tokenize, model: str | None = None) -> TokenCounter:
    """The tokenizer to start with. `auto`: the upstream's /tokenize when it answers (with each token's text,
    else a count), else the calibrated character estimate; `Discovery` may find an exact local one later."""
    choice = section.tokenizer
    if choice == "chars":
        return CharsEstimator()
    if choice == "upstream":
        return await upstream_counter(upstream, model) or UpstreamTokenizer(upstream)
    if choice != "auto":
        try:
            return await asyncio.to_thread(load_local, Path(choice))  # reading the file blocks
        except UnsupportedVocabulary as exc:
            raise ValueError(str(exc)) from exc
    return await upstream_counter(upstream, model) or CharsEstimator()


def upstream_clients(session: aiohttp.ClientSession, urls: list[str], section: UpstreamSection) -> list[UpstreamClient]:
    """One client per upstream URL, each configured from the section."""
    return [UpstreamClient(session, url, section) for url in urls]


def discovery_knobs(sections: Sections) -> DiscoveryKnobs:
    return DiscoveryKnobs(
        upstream_kind=sections.upstream.kind,
        upstream_model=sections.upstream.model,
        max_concurrency=sections.policies.max_concurrency,
        tokenizer=sections.budget.tokenizer,
        fim_template_chosen=sections.budget.fim_template_chosen,
    )


@dataclass(slots=True)
class Core:
    """The completion core of one proxy."""

    policies: Policies
    budget: ContextBudget
    service: CompletionService
    discovery: Discovery


def build_core(
    sections: Sections,
    source: CompletionSource,
    primary: UpstreamClient,
    counter: TokenCounter,
    telemetry: Telemetry,
    slots: int | None = None,
    embedded_model: Path | None = None,
    tokenize: Tokenize | None = None,
) -> Core:
    """The service over `source` (one upstream, or several in failover order) and the discovery of `primary`."""
    policies = build_policies(sections.policies, slots, telemetry.clock)
    budget = ContextBudget(budget_settings(sections.budget), counter)
    known = sections.policies.max_concurrency != 0 or slots is not None
    discovery = Discovery(discovery_knobs(sections), primary, policies, budget, embedded_model, known, tokenize)
    return Core(policies, budget, CompletionService(source, policies, budget, telemetry), discovery)
