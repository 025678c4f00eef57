"""The model server's `/metrics` (Prometheus text), read with prometheus_client's own parser: the proxy reads
what the server holds from it (`UpstreamClient.held`: llama.cpp's `llamacpp:requests_processing` and
`requests_deferred`, vLLM's `vllm:num_requests_running` and `num_requests_waiting`), the bench what the server
did."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

PREFIX = "llamacpp:"
VLLM_RUNNING, VLLM_WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


def _samples(text: str) -> list[Sample] | None:
    """Every sample of `text`; None when it is not Prometheus exposition (an HTML page, a JSON error)."""
    try:
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError:
        return None


def _llamacpp(samples: list[Sample]) -> dict[str, float]:
    return {s.name.removeprefix(PREFIX): s.value for s in samples if s.name.startswith(PREFIX)}


def llamacpp_metrics(text: str) -> dict[str, float] | None:
    """The `llamacpp:` samples by name without the prefix (`requests_processing`, `prompt_tokens_total`,
    ...); None when `text` is not Prometheus exposition (an HTML page, a JSON error)."""
    samples = _samples(text)
    return None if samples is None else _llamacpp(samples)


def held_requests(metrics: dict[str, float]) -> int | None:
    """Requests llama.cpp holds, running and queued (from `llamacpp_metrics`); None when it does not say both."""
    try:
        return int(metrics["requests_processing"] + metrics["requests_deferred"])
    except KeyError:
        return None


def held_from_metrics(text: str) -> int | None:
    """Requests the server holds, running and queued, from its `/metrics`: llama.cpp's, or vLLM's (summed over
    its label sets: one per model and engine); None when it says neither."""
    samples = _samples(text)  # parsed once: a cancelled request's slot polls this
    if samples is None:
        return None
    held = held_requests(_llamacpp(samples))
    if held is not None:
        return held
    running = [s.value for s in samples if s.name == VLLM_RUNNING]
    waiting = [s.value for s in samples if s.name == VLLM_WAITING]
    return int(sum(running) + sum(waiting)) if running and waiting else None
