"""Inferred acceptance: a suggestion's kept characters, seen from the session's next requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.models import Chunk, Completion, NormalizedRequest
from mellum_proxy.telemetry.acceptance import AcceptanceTracker, Judged
from mellum_proxy.telemetry.stats import read_log, stats
from tests.conftest import ProxyFactory

PREFIX = "def count(items):\n    total = 0\n    for item in items:\n        "


def arrive(tracker: AcceptanceTracker, number: int, prefix: str, session: str = "s") -> Judged | None:
    return tracker.arrived(NormalizedRequest(id=str(number), route="openai", session=session, prefix=prefix))


def shown(text: str) -> Completion:
    completion = Completion(id="c")
    completion.add(Chunk(text))
    return completion


def shown_once(text: str) -> AcceptanceTracker:
    tracker = AcceptanceTracker()
    assert arrive(tracker, 1, PREFIX) is None
    assert tracker.shown("1", "s", shown(text), reused=False) is None
    return tracker


def test_typed_through_then_past_it_keeps_all_of_it() -> None:
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "tot") is None  # still typing through it
    assert arrive(tracker, 3, PREFIX + "total += 1\n    ") == Judged("1", "s", 10)


def test_accepted_at_once_and_typed_on() -> None:
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, "# a window that moved\n" + PREFIX + "total += 1\n    return") == Judged("1", "s", 10)


def test_a_different_text_keeps_what_matched() -> None:
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "total = ") == Judged("1", "s", 6)  # `total ` then something else
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "print(") == Judged("1", "s", 0)


def test_moving_elsewhere_settles_it_with_what_was_kept() -> None:
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "to") is None
    assert arrive(tracker, 3, "import os\n") == Judged("1", "s", 2)


def test_a_new_suggestion_settles_the_last_and_reuse_is_the_same_suggestion() -> None:
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "total") is None
    assert tracker.shown("2", "s", shown(" += 1"), reused=True) is None  # the rest of the same suggestion
    assert arrive(tracker, 3, PREFIX + "total +") is None
    assert tracker.shown("3", "s", shown("= 2"), reused=False) == Judged("1", "s", 7)
    assert tracker.settle_all() == [Judged("3", "s", 0)]
    assert tracker.settle_all() == []


def test_sessions_are_judged_apart() -> None:
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, "elsewhere", session="other") is None
    assert arrive(tracker, 3, PREFIX + "total += 1\n") == Judged("1", "s", 10)


def test_a_look_ahead_carrying_the_whole_suggestion_is_no_evidence() -> None:
    """llama.vim asks at once for what follows a suggestion it shows, its prefix carrying all of it: until the
    person types, nothing is kept (it read ~3.3x too high); the look-ahead's own answer is not judged."""
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "total += 1") is None
    assert tracker.shown("2", "s", shown("\n    return total"), reused=False) is None  # not shown to the person
    assert arrive(tracker, 3, PREFIX + "print(") == Judged("1", "s", 0)  # typed something else
    tracker = shown_once("total += 1")
    assert arrive(tracker, 2, PREFIX + "total += 1") is None
    assert arrive(tracker, 3, PREFIX + "total += 1\n    ") == Judged("1", "s", 10)  # accepted and typed on


async def test_the_log_the_metrics_and_stats_agree(
    make_proxy: ProxyFactory, fake_upstream: Any, tmp_path: Path
) -> None:
    _, url = await fake_upstream(pieces=["total", " +=", " 1"])
    log = tmp_path / "log.jsonl"
    proxy = await make_proxy(upstream=url, tokenizer="chars", debounce_ms=0, timeout_ms=0, log=log, reuse=False)

    async def complete(session: str, prefix: str) -> str:
        resp = await proxy.post("/v1/completions", json={"prompt": prefix, "suffix": "\n", "max_tokens": 8},
                                headers={"X-Session-Id": session})  # fmt: skip
        return str((await resp.json())["choices"][0]["text"])

    assert await complete("keeps", PREFIX) == "total += 1"
    assert await complete("rejects", PREFIX) == "total += 1"
    await complete("keeps", PREFIX + "total += 1\n        ")  # accepted, and the next line begun
    await complete("rejects", PREFIX + "print(")  # wrote something else
    metrics = (await (await proxy.get("/metrics")).text()).splitlines()
    assert "mellum_proxy_suggestions_judged_total 2.0" in metrics
    assert "mellum_proxy_suggestions_accepted_total 1.0" in metrics
    assert "mellum_proxy_accepted_chars_total 10.0" in metrics
    await proxy.close()  # shut down: the last two suggestions are settled, and the log flushed
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    judged = {line["id"]: line["accepted_chars"] for line in lines if line.get("event") == "acceptance"}
    first_keeps, first_rejects = (line["id"] for line in lines[:2] if "outcome" in line)
    assert judged[first_keeps] == 10 and judged[first_rejects] == 0 and len(judged) == 4
    records, malformed = read_log(log)
    summary = stats(records, malformed)["all"]
    assert malformed == 0 and summary["suggestions_judged"] == 4
    assert summary["acceptance_rate"] == 0.25 and summary["accepted_chars_per_suggestion"] == 2.5
    assert "total += 1" not in log.read_text()  # no source text in the log
