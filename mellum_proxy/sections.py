"""The settings as the components take them: one section each, units converted once.

`mellum_proxy.config.Settings` is what a user writes (flat: a flag, an environment variable and a TOML key per
setting, all kept as they are). `sections(settings)` turns it into this tree once, at start: seconds where
the settings say milliseconds, the dispatch rule resolved, `0 = off` as None. Each component gets only its
own section (`Flights` and the policies `PolicySection`, the budget `BudgetSection`, the upstream clients
`UpstreamSection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mellum_proxy.config import Settings


def _seconds(ms: float) -> float:
    return ms / 1000


def _seconds_or_none(ms: float) -> float | None:
    """A duration where 0 means "none"."""
    return ms / 1000 if ms else None


@dataclass(frozen=True, slots=True)
class ListenSection:
    host: str
    port: int
    auth_token: str | None
    loopback_only: bool
    max_body_bytes: int
    shutdown_grace_s: float


@dataclass(frozen=True, slots=True)
class UpstreamSection:
    urls: tuple[str, ...]
    urls_set: bool  # the user named them (with --embedded: they come first, the embedded server last)
    kind: str
    model: str | None  # None: the one the upstream lists
    api_key: str | None
    headers: dict[str, str] = field(default_factory=dict)
    routing_header: str | None = None  # None: no routing key
    route_sessions: bool = False  # key by the editor session, not the developer
    developer_id: str = ""
    default_temperature: float | None = None
    health_interval_s: float = 1.0
    connect_timeout_s: float = 1.0
    answer_timeout_s: float | None = 5.0  # None: none
    passthrough_silence_s: float | None = 30.0  # None: none


@dataclass(frozen=True, slots=True)
class EmbeddedSection:
    enabled: bool
    model: Path | None
    ctx_tokens: int
    slots: int
    threads: int  # 0: `mellum_proxy.upstream.embedded.default_threads`


@dataclass(frozen=True, slots=True)
class PolicySection:
    dispatch: str  # "adaptive" or "fixed" (resolved: `debounce_ms` alone asks for the fixed hold)
    debounce_s: float
    hold_idle_max_s: float
    hold_busy_max_s: float
    hold_min_s: float
    hold_gap_factor: float
    reuse: bool
    keep_prefill: bool
    max_inflight: int
    max_concurrency: int  # 0: the upstream's slots
    max_queue: int
    ttft_timeout_s: float | None
    timeout_s: float | None
    complete_in_comments: bool
    postprocess: bool


@dataclass(frozen=True, slots=True)
class BudgetSection:
    max_context_tokens: int
    max_tokens: int
    prefix_ratio: float
    step_lines: int
    tokenizer: str
    fim_template: str
    fim_template_chosen: bool  # the user set it (kept even when the model does not know its markers)
    stop_at_blank_line: bool


@dataclass(frozen=True, slots=True)
class TelemetrySection:
    log: Path | None
    log_max_bytes: int
    log_content: bool
    record: Path | None
    vram_interval_s: float
    gpu: int
    upstream_pid: int | None


@dataclass(frozen=True, slots=True)
class Sections:
    listen: ListenSection
    upstream: UpstreamSection
    embedded: EmbeddedSection
    policies: PolicySection
    budget: BudgetSection
    telemetry: TelemetrySection


def sections(settings: Settings) -> Sections:
    """The tree of `settings`, with units converted."""
    s = settings
    return Sections(
        listen=ListenSection(
            s.listen_host, s.listen_port, s.auth_token, s.loopback_only, s.max_body_bytes, s.shutdown_timeout_s
        ),
        upstream=UpstreamSection(
            urls=s.upstream,
            urls_set="upstream" in s.model_fields_set,
            kind=s.upstream_kind,
            model=s.upstream_model,
            api_key=s.upstream_api_key,
            headers=s.headers,
            routing_header=s.routing_key_header if s.routing_key != "none" else None,
            route_sessions=s.routing_key == "session",
            developer_id=s.developer_id,
            default_temperature=s.default_temperature,
            health_interval_s=_seconds(s.health_interval_ms),
            connect_timeout_s=_seconds(s.upstream_connect_timeout_ms),
            answer_timeout_s=_seconds_or_none(s.upstream_answer_timeout_ms),
            passthrough_silence_s=_seconds_or_none(s.passthrough_timeout_ms),
        ),
        embedded=EmbeddedSection(s.embedded, s.model, s.embedded_ctx_tokens, s.embedded_slots, s.embedded_threads),
        policies=PolicySection(
            dispatch=s.dispatch_rule,
            debounce_s=_seconds(s.debounce_ms),
            hold_idle_max_s=_seconds(s.hold_idle_max_ms),
            hold_busy_max_s=_seconds(s.hold_busy_max_ms),
            hold_min_s=_seconds(s.hold_min_ms),
            hold_gap_factor=s.hold_gap_factor,
            reuse=s.reuse,
            keep_prefill=s.keep_prefill,
            max_inflight=s.max_inflight,
            max_concurrency=s.max_concurrency,
            max_queue=s.max_queue,
            ttft_timeout_s=_seconds_or_none(s.ttft_timeout_ms),
            timeout_s=_seconds_or_none(s.timeout_ms),
            complete_in_comments=s.complete_in_comments,
            postprocess=s.postprocess,
        ),
        budget=BudgetSection(
            max_context_tokens=s.max_context_tokens,
            max_tokens=s.max_tokens,
            prefix_ratio=s.prefix_ratio,
            step_lines=s.context_step_lines,
            tokenizer=s.tokenizer,
            fim_template=s.fim_template,
            fim_template_chosen="fim_template" in s.model_fields_set,
            stop_at_blank_line=s.stop_at_blank_line,
        ),
        telemetry=TelemetrySection(
            log=s.log,
            log_max_bytes=int(s.log_max_mb * 1024 * 1024),
            log_content=s.log_content,
            record=s.record,
            vram_interval_s=_seconds(s.vram_interval_ms),
            gpu=s.gpu,
            upstream_pid=s.upstream_pid or None,
        ),
    )
