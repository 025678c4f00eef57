"""llama.cpp's `/metrics` (Prometheus text), read with prometheus_client's own parser: the proxy reads
what the server holds from it (`UpstreamClient.held`), the bench what the server did."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "llamacpp:"


def llamacpp_metrics(text: str) -> dict[str, float] | None:
    """The `llamacpp:` samples by name without the prefix (`requests_processing`, `prompt_tokens_total`,
    ...); None when `text` is not Prometheus exposition (an HTML page, a JSON error)."""
    try:
        samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError:
        return None
    return {s.name.removeprefix(PREFIX): s.value for s in samples if s.name.startswith(PREFIX)}


def held_requests(metrics: dict[str, float]) -> int | None:
    """Requests the server holds, running and queued; None when it does not say both."""
    try:
        return int(metrics["requests_processing"] + metrics["requests_deferred"])
    except KeyError:
        return None
