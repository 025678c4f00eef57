"""The model server's `/metrics` (Prometheus text), read with prometheus_client's own parser: the proxy reads
what the server holds from it (each kind's `held_gauges`: llama.cpp's `requests_processing` and
`requests_deferred`, vLLM's `num_requests_running` and `num_requests_waiting`), the bench what the server did."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str) -> list[Sample] | None:
    """Every sample of `text`; None when it is not Prometheus exposition (an HTML page, a JSON error)."""
    try:
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError:
        return None


def by_name(text: str) -> dict[str, float] | None:
    """Each sample's value by its name (the last of a name's label sets); None when `text` is not exposition."""
    found = samples(text)
    return None if found is None else {sample.name: sample.value for sample in found}


def held_from_metrics(text: str, gauge_sets: Iterable[tuple[str, ...]]) -> int | None:
    """What the server runs and queues: the sum of the first set of gauges it reports all of (each summed over
    its label sets: vLLM has one per model and engine); None when it reports none of the sets."""
    found = samples(text)  # parsed once: a cancelled request's slot polls this
    if found is None:
        return None
    for gauges in gauge_sets:
        values = {name: [s.value for s in found if s.name == name] for name in gauges}
        if gauges and all(values.values()):
            return int(sum(sum(each) for each in values.values()))
    return None
