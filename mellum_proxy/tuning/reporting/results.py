"""What a replay produces, for the reports: the person's view (`Seen`, the same for every replay) and
the server's side of a real-time replay (`PolicyResult`), of a lab run (`LabResult`) and of a team's
phase (`Phase`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mellum_proxy.tuning.workloads.editor import Accounting


@dataclass(kw_only=True)
class Seen:
    """What the person at the keyboard saw under one policy (`mellum_proxy.tuning.workloads.editor.account`)."""

    policy: str
    edits: int
    pauses: int
    pause_coverage: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    predicted_chars: int | None = None  # at each pause, how much of what the person typed next was shown
    kept_per_shown: float | None = None  # characters typed on through, per shown suggestion (inferred acceptance)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    covered_pauses: list[int] = field(default_factory=list, repr=False)  # the pause of each of `latencies_ms`

    @staticmethod
    def of(acct: Accounting) -> dict[str, Any]:
        """The fields above (but the policy) from an accounting."""
        return {"edits": acct.edits, "pauses": acct.pauses, "pause_coverage": acct.pause_coverage,
                "latency_p50_ms": acct.latency(50), "latency_p95_ms": acct.latency(95),
                "predicted_chars": acct.predicted_chars, "latencies_ms": acct.latencies_ms,
                "covered_pauses": acct.covered_pauses,
                "kept_per_shown": acct.kept_chars / acct.shown if acct.shown else None}  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """Every field but the long series."""
        data = asdict(self)
        for key in ("latencies_ms", "covered_pauses", "inflight_series", "upstream_series"):
            data.pop(key, None)
        return data


@dataclass(kw_only=True)
class PolicyResult(Seen):
    """One policy replayed in real time against a server (`bench replay`)."""

    client_requests: int
    upstream_requests: int
    shown: int
    upstream_prompt_tokens: float | None
    upstream_completion_tokens: float | None
    shown_completion_tokens: int
    wasted_completion_tokens: float | None
    timeouts: int
    errors: int
    max_queue_depth: int
    max_inflight: int
    vram_peak_mib: float | None
    duration_s: float
    idle_wait_s: float | None = None  # how long the server took to be idle before this policy began
    drain_s: float | None = None  # how long it went on with this policy's requests after the last edit
    served_by: dict[str, int] = field(default_factory=dict)  # upstream requests answered, per upstream
    upstream_errors: int = 0  # completions the proxy answered with an upstream error
    record_prompt_tokens: int = 0  # prompt tokens of the answered requests (their usage)
    record_cached_tokens: int = 0  # of which the server reused from its cache
    decode_ms_per_token: float | None = None  # the server's own decode time a token (its `/metrics`), if it says
    draft_n: int | None = None  # tokens the server's speculation drafted over the replay (None: it does not draft)
    draft_n_accepted: int | None = None  # of which the model accepted
    # (arrival unix s, upstream that answered, outcome, total ms) of each request that reached the upstream
    upstream_series: list[tuple[float, str | None, str, float]] = field(default_factory=list)
    inflight_series: list[tuple[float, float, float]] = field(default_factory=list)  # (s, running, queued)


@dataclass(kw_only=True)
class LabResult(Seen):
    """One policy over one trace on one simulated server, in virtual time (`bench lab`)."""

    trace: str
    profile: str
    accuracy: float
    upstream_requests: int
    requests_per_edit: float
    completion_tokens: int
    wasted_completion_tokens: int
    prompt_tokens_computed: int
    reused: int
    timeouts: int
    errors: int
    peak_held: int
    settings: dict[str, Any] | None = None
    decode_ms_per_token: float | None = None  # counted as llama.cpp counts it (`SimEngine.decode_seconds`)


@dataclass
class Phase:
    """One phase of `benchmarks team`: its router policy, each developer's result, where their requests went."""

    name: str
    router_policy: str
    results: list[PolicyResult]
    workers: dict[str, dict[str, int]]  # developer -> worker -> requests
    events: dict[str, float] = field(default_factory=dict)  # what happened when (unix seconds)
    notes: list[str] = field(default_factory=list)
    fallback: str | None = None


def ms_per_token(seconds: float | None, tokens: float | None) -> float | None:
    """Milliseconds a token (`tokens_predicted_seconds_total` over `tokens_predicted_total`); None without tokens,
    or where a counter went back (the server restarted between the two readings)."""
    return seconds * 1000 / tokens if seconds is not None and seconds >= 0 and tokens and tokens > 0 else None
