"""The composition root: the completion core built from the settings' sections.

`open_core` is the one way a proxy starts and stops its core: the upstream session, the clients in failover
order, discovery and its tasks, the service; `serve`, `serve_app` and so the tests and the bench enter it
through the HTTP edge (`mellum_proxy.http.lifecycle`). The policy lab (`mellum_proxy.tuning.runners.lab`) runs
the core on a simulated server in virtual time, built from the same parts: `build_policies`, `BudgetSettings.of`
and `build_core`. Nothing here knows HTTP servers.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from mellum_proxy.budget import (
    BudgetSettings,
    CharsEstimator,
    ContextBudget,
    TokenCounter,
    UpstreamTokenizer,
)
from mellum_proxy.budget.local import load_local
from mellum_proxy.budget.tokenizers import Tokenize, upstream_counter
from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.discovery import Discovery
from mellum_proxy.errors import UpstreamError
from mellum_proxy.policies import AdmissionQueue, Debouncer, Guard, HoldRule, Supersede
from mellum_proxy.sections import BudgetSection, PolicySection, Sections, UpstreamSection
from mellum_proxy.serving import CompletionService, Policies
from mellum_proxy.serving.reuse import ReuseCache
from mellum_proxy.telemetry import Telemetry
from mellum_proxy.upstream.capabilities import CompletionSource
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.failover import Upstreams, failover_answer_s
from mellum_proxy.upstream.health import answer_problem
from mellum_proxy.upstream.servers import discover

log = logging.getLogger("mellum_proxy")


def build_policies(
    section: PolicySection,
    slots: int | None = None,
    clock: Clock = LOOP_CLOCK,
    guards: tuple[Guard, ...] = (),
    hold: Callable[[Clock], HoldRule] | None = None,
) -> Policies:
    """The policies; `max_concurrency = 0` takes the upstream's `slots` (1 while unknown)."""
    limit = section.max_concurrency
    if limit == 0:
        limit = slots or 1
        why = f"the upstream's {slots} slots" if slots else "1 until the upstream says how many slots it has"
        log.debug("max_concurrency: %s", why)
    return Policies(
        debouncer=Debouncer(0.0, clock),  # it holds as long as the rule says
        supersede=Supersede(section.max_inflight),
        admission=AdmissionQueue(limit, section.max_queue, section.completion_reserve, section.max_bulk_queue),
        ttft_timeout_s=section.ttft_timeout_s,
        timeout_s=section.timeout_s,
        postprocess=section.postprocess,
        clock=clock,
        hold=hold(clock) if hold is not None else None,
        reuse=ReuseCache() if section.reuse else None,
        keep_prefill=section.keep_prefill,
        bulk_wait_s=section.bulk_wait_s,
        guards=guards,
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
        except ValueError as exc:  # no tokenizer in it (UnsupportedVocabulary too): said in one line at start
            raise RuntimeError(f"--tokenizer {choice}: {exc}") from exc
    return await upstream_counter(upstream, model) or CharsEstimator()


def upstream_clients(session: aiohttp.ClientSession, urls: list[str], section: UpstreamSection) -> list[UpstreamClient]:
    """One client per upstream URL, each configured from the section."""
    return [UpstreamClient(session, url, section) for url in urls]


@dataclass(slots=True)
class Core:
    """The completion core of one proxy (`pool`: its upstreams in failover order, once `open_core` runs it)."""

    policies: Policies
    budget: ContextBudget
    service: CompletionService
    discovery: Discovery
    pool: Upstreams | None = None


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
    service = build_service(sections, source, counter, telemetry, slots)
    policies, budget = service.policies, service.budget
    known = sections.policies.max_concurrency != 0 or slots is not None
    discovery = Discovery(sections.discovery, primary, policies, budget, embedded_model, known, tokenize)
    return Core(policies, budget, service, discovery)


def build_service(
    sections: Sections, source: CompletionSource, counter: TokenCounter, telemetry: Telemetry, slots: int | None = None
) -> CompletionService:
    """The completion service over `source` with the policies and the budget the sections say: what a proxy
    runs (`build_core`), and what the policy lab runs on its simulated server."""
    policies = build_policies(sections.policies, slots, telemetry.clock, sections.guards, sections.hold)
    budget = ContextBudget(BudgetSettings.of(sections.budget), counter)
    return CompletionService(source, policies, budget, telemetry)


def upstream_urls(section: UpstreamSection, embedded_url: str | None) -> list[str]:
    """The upstreams in order: the embedded server alone, or after the `upstream`s the user set."""
    if embedded_url is None:
        return list(section.urls)
    if not section.urls_set:
        return [embedded_url]
    return [*section.urls, embedded_url]


@asynccontextmanager
async def open_core(
    sections: Sections,
    telemetry: Telemetry,
    embedded_url: str | None = None,
    embedded_model: Path | None = None,
    on_built: Callable[[Core], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> AsyncIterator[Core]:
    """The core over its upstreams for the body of the `async with`.

    Args:
        embedded_url, embedded_model: the embedded server, when there is one (the last fallback, or the upstream).
        on_built: called with the core before discovery decides anything (the edge files it where routes read it).
        on_ready: called once everything a completion depends on is decided (the ready block).

    On exit the service is closed at once (its grace period is the caller's shutdown step, which comes first),
    then the discovery and health tasks, then the session, so nothing outlives what it uses.
    """
    section = sections.upstream
    urls = upstream_urls(section, embedded_url)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=section.connect_timeout_s)
    connector = aiohttp.TCPConnector(limit=upstream_connection_limit())  # concurrency is the policies' job; this
    # keeps the process under its file limit (the listener's connections have another share)
    headers = dict(section.headers)  # on every upstream request, pass-through too
    if section.api_key:
        headers["Authorization"] = f"Bearer {section.api_key}"
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers or None) as session:
        clients = upstream_clients(session, urls, section)
        upstream = clients[0]  # the primary: what discovery asks; the others are its fallbacks
        answer_s = failover_answer_s(sections.policies.timeout_s, section.answer_timeout_s)
        pool = Upstreams(clients, answer_s, section.health_interval_s, sections.policies.timeout_s)
        pool.reveal = sections.telemetry.log_content
        problems = await asyncio.gather(*(answer_problem(client) for client in clients))
        reachable = [problem is None for problem in problems]
        for member, problem in zip(pool.members, problems, strict=True):
            if problem is not None:
                pool.mark_down(member, problem)  # said at once, on the console; and again when it answers
        found = await discover(upstream, section.kind) if reachable[0] else None
        slots = found.slots if found is not None and sections.policies.max_concurrency == 0 else None
        counter = await build_counter(sections.budget, pool, upstream.model)
        model = embedded_model if embedded_url is not None and urls[0] == embedded_url else None
        core = build_core(sections, pool, upstream, counter, telemetry, slots, model, tokenize=pool)
        core.pool = pool
        if on_built is not None:
            on_built(core)
        discovery = core.discovery
        if found is not None:
            discovery.apply(found)
        if core.budget.settings.template is None:
            log.warning("fim_template=none sends the text after the cursor as `suffix`: vLLM and llama.cpp "
                        "builds that list it as unsupported answer 400; prefer the model's template")  # fmt: skip
        discovery.on_ready = on_ready
        if reachable[0]:
            await discovery.prepare()  # decided (and the embedded server warm) before the first request can come
        tasks = [asyncio.create_task(discovery.run(), name="upstream-discovery")]
        pool.on_up = pool.on_restart = returning(upstream, discovery, fallback_discovery(section.model))
        if len(clients) > 1:
            for client, up in zip(clients[1:], reachable[1:], strict=True):
                if up:
                    await pool.on_up(client)
            log.info("upstreams in order: %s; health checked every %.0f ms",
                     ", ".join(c.shown_url for c in clients), section.health_interval_s * 1000)  # fmt: skip
            if pool.client is not upstream:
                await discovery.follow(pool.client)  # the primary is down: the fallback serves, as it is
            tasks.append(asyncio.create_task(follow_serving(pool, discovery), name="upstream-follow"))
        tasks.append(asyncio.create_task(pool.watch(section.health_interval_s), name="upstream-health"))
        try:
            yield core
        finally:
            await core.service.close(0)  # its tasks use the session: they end before it closes
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await pool.close()


def upstream_connection_limit() -> int:
    """The most connections to upstreams at once: an eighth of the process's open-file limit (0: no limit, where
    the process has none; 128 at the usual 1,024), so that passed-through streams and keep-alive pools cannot
    exhaust it. The listener has half; the rest is the process's own files and sockets still closing."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 0 if soft == resource.RLIM_INFINITY else max(8, soft // 8)


def returning(
    primary: UpstreamClient, discovery: Discovery, fallback: Callable[[UpstreamClient], Awaitable[None]]
) -> Callable[[UpstreamClient], Awaitable[None]]:
    """What an upstream that is back (or may have restarted) is asked: the primary by discovery, which follows a
    new model or context; a fallback what it serves."""

    async def ask(client: UpstreamClient) -> None:
        if client is not primary:
            await fallback(client)
        elif discovery.ready.is_set():  # before that, discovery's own run asks it
            await discovery.rediscover()

    return ask


def fallback_discovery(model: str | None) -> Callable[[UpstreamClient], Awaitable[None]]:
    """What a fallback upstream says when it is (again) up: the model it serves (its context, slots and
    tokenizer are taken when it serves: `Discovery.follow`)."""

    async def discover_fallback(client: UpstreamClient) -> None:
        found = await discover(client)
        if model is None and found.model is not None:
            client.model = found.model
        log.info("fallback upstream %s: %s", client.shown_url, found.describe())

    return discover_fallback


async def follow_serving(pool: Upstreams, discovery: Discovery) -> None:
    """For the core's lifetime: whenever another upstream starts serving, the proxy follows it."""
    followed = [pool.client]
    while True:
        try:
            await pool.changes.wait_for(lambda: pool.client is not followed[-1], timeout_s=3600)
        except TimeoutError:
            continue
        current = pool.client
        followed[-1:] = [current]
        try:
            await discovery.follow(current)
        except UpstreamError as exc:  # it went down again meanwhile: the next change says who serves
            log.info("upstream %s: %s", current.shown_url, exc.type)
