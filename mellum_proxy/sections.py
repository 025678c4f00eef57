"""The settings as the components take them: one section each, units converted once.

`mellum_proxy.config.Settings` is what a user writes (flat: a flag, an environment variable and a TOML key per
setting, all kept as they are). `sections(settings)` turns it into this tree once, at start: seconds where
the settings say milliseconds, the dispatch rule resolved, `0 = off` as None. Each component gets only its
own section (`Flights` and the policies `PolicySection`, the budget `BudgetSection`, the upstream clients
`UpstreamSection`).

A section field is read from the setting of its own name; one whose name differs says, in its `field`
metadata, which setting it reads (`source`) and how it converts it, or how it is derived from several
(`derived`). So a setting is spelled once, in `Settings`, and each section field once, where it is declared:
there is no mapping to keep in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from mellum_proxy.budget.templates import FimTemplate, template_for
from mellum_proxy.clock import Clock
from mellum_proxy.config import Settings
from mellum_proxy.policies.holds import HoldRule, hold_named
from mellum_proxy.policies.registry import Guard, build_guards

T = TypeVar("T")


def _seconds(ms: float) -> float:
    return ms / 1000


def _seconds_or_none(ms: float) -> float | None:
    """A duration where 0 means "none"."""
    return ms / 1000 if ms else None


def source(setting: str, convert: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """A section field's metadata: read from `setting` (another name than its own), converted by `convert`."""
    return {"setting": setting, "convert": convert}


def derived(compute: Callable[[Settings], Any]) -> dict[str, Any]:
    """A section field's metadata: computed from the settings as a whole (what the user named, a rule)."""
    return {"derive": compute}


def _build(cls: type[T], settings: Settings) -> T:
    values: dict[str, Any] = {}
    for spec in fields(cls):  # type: ignore[arg-type]  # a section dataclass
        meta = spec.metadata
        if "derive" in meta:
            values[spec.name] = meta["derive"](settings)
            continue
        value = getattr(settings, meta.get("setting") or spec.name)
        values[spec.name] = meta["convert"](value) if meta.get("convert") else value
    return cls(**values)


@dataclass(frozen=True, slots=True)
class ListenSection:
    host: str = field(metadata=source("listen_host"))
    port: int = field(metadata=source("listen_port"))
    auth_token: str | None
    loopback_only: bool
    max_body_bytes: int
    shutdown_grace_s: float = field(metadata=source("shutdown_timeout_s"))
    idle_timeout_s: float = field(metadata=source("idle_timeout_ms", _seconds))


@dataclass(frozen=True, slots=True)
class UpstreamSection:
    urls: tuple[str, ...] = field(metadata=source("upstream"))
    # the user named them (with --embedded: they come first, the embedded server last)
    urls_set: bool = field(metadata=derived(lambda s: "upstream" in s.model_fields_set))
    kind: str = field(metadata=source("upstream_kind"))
    model: str | None = field(metadata=source("upstream_model"))  # None: the one the upstream lists
    api_key: str | None = field(metadata=source("upstream_api_key"))
    headers: dict[str, str]
    routing_header: str | None = field(
        metadata=derived(lambda s: s.routing_key_header if s.routing_key != "none" else None)
    )
    route_sessions: bool = field(metadata=derived(lambda s: s.routing_key == "session"))  # by the editor session
    developer_id: str
    default_temperature: float | None
    health_interval_s: float = field(metadata=source("health_interval_ms", _seconds))
    connect_timeout_s: float = field(metadata=source("upstream_connect_timeout_ms", _seconds))
    keep_alive: str  # Ollama's `keep_alive` on every completion the client sends none for
    answer_timeout_s: float | None = field(metadata=source("upstream_answer_timeout_ms", _seconds_or_none))
    passthrough_silence_s: float | None = field(metadata=source("passthrough_timeout_ms", _seconds_or_none))
    priority: bool = field(metadata=source("upstream_priority"))  # completions sent with `COMPLETION_PRIORITY`
    # llm-d's `x-llm-d-slo-ttft-ms` on completions: the first-token deadline, else the whole one (None: not sent)
    slo_ttft_ms: int | None = field(
        metadata=derived(lambda s: (s.ttft_timeout_ms or s.timeout_ms or None) if s.slo_header else None)
    )


@dataclass(frozen=True, slots=True)
class EmbeddedSection:
    enabled: bool = field(metadata=source("embedded"))
    model: Path | None
    ctx_tokens: int = field(metadata=source("embedded_ctx_tokens"))
    slots: int = field(metadata=source("embedded_slots"))
    threads: int = field(metadata=source("embedded_threads"))  # 0: `mellum_proxy.upstream.embedded.default_threads`
    kv_type: str = field(metadata=source("embedded_kv_type"))
    sleep_idle_s: int = field(metadata=source("embedded_sleep_idle_s"))
    spec: str = field(metadata=source("embedded_spec"))
    cache_reuse: int = field(metadata=source("embedded_cache_reuse"))


@dataclass(frozen=True, slots=True)
class PolicySection:
    dispatch: str = field(metadata=source("dispatch_rule"))  # the hold rule in force (`debounce_ms` alone: fixed)
    reuse: bool
    keep_prefill: bool
    max_inflight: int
    max_concurrency: int  # 0: the upstream's slots
    max_queue: int
    ttft_timeout_s: float | None = field(metadata=source("ttft_timeout_ms", _seconds_or_none))
    timeout_s: float | None = field(metadata=source("timeout_ms", _seconds_or_none))
    postprocess: bool
    completion_reserve: int
    max_bulk_queue: int
    bulk_wait_s: float | None = field(metadata=source("bulk_wait_ms", _seconds_or_none))


@dataclass(frozen=True, slots=True)
class BudgetSection:
    max_context_tokens: int
    max_tokens: int
    prefix_ratio: float
    step_lines: int = field(metadata=source("context_step_lines"))
    tokenizer: str
    fim_template: str
    # the user set it (kept even when the model does not know its markers)
    fim_template_chosen: bool = field(metadata=derived(lambda s: "fim_template" in s.model_fields_set))
    stop_at_blank_line: bool
    template: FimTemplate | None = field(metadata=derived(lambda s: template_for(s.fim_template)))  # None: "none"
    stops: tuple[str, ...] = field(metadata=derived(lambda s: ("\n\n",) if s.stop_at_blank_line else ()))


@dataclass(frozen=True, slots=True)
class TelemetrySection:
    log: Path | None
    log_max_bytes: int = field(metadata=source("log_max_mb", lambda mb: int(mb * 1024 * 1024)))
    log_keep: int
    log_content: bool
    record: Path | None
    vram_interval_s: float = field(metadata=source("vram_interval_ms", _seconds))
    gpu: int
    upstream_pid: int | None = field(metadata=source("upstream_pid", lambda pid: pid or None))


@dataclass(frozen=True, slots=True)
class DiscoverySection:
    """What the settings say about the upstream, for discovery: what it may find out and what it must keep."""

    upstream_kind: str
    upstream_model: str | None
    max_concurrency: int  # 0: the upstream's slots
    tokenizer: str
    fim_template_chosen: bool = field(metadata=derived(lambda s: "fim_template" in s.model_fields_set))


@dataclass(frozen=True, slots=True)
class Sections:
    listen: ListenSection
    upstream: UpstreamSection
    embedded: EmbeddedSection
    policies: PolicySection
    budget: BudgetSection
    telemetry: TelemetrySection
    discovery: DiscoverySection
    guards: tuple[Guard, ...] = ()  # the registered guards the settings turn on (`mellum_proxy.policies.registry`)
    hold: Callable[[Clock], HoldRule] | None = None  # the hold rule in force, built on a clock (`policies.holds`)


def sections(settings: Settings) -> Sections:
    """The tree of `settings`, with units converted."""
    return Sections(
        listen=_build(ListenSection, settings),
        upstream=_build(UpstreamSection, settings),
        embedded=_build(EmbeddedSection, settings),
        policies=_build(PolicySection, settings),
        discovery=_build(DiscoverySection, settings),
        budget=_build(BudgetSection, settings),
        telemetry=_build(TelemetrySection, settings),
        guards=build_guards(settings),
        hold=partial(hold_named(settings.dispatch_rule).build, settings),
    )
