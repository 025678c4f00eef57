"""`RecentRecords`: what the live page's stream reads after what it has sent."""

from __future__ import annotations

from mellum_proxy.models import NormalizedRequest
from mellum_proxy.telemetry.acceptance import Judged
from mellum_proxy.telemetry.record import RecentRecords, RequestRecord


def record(number: int) -> RequestRecord:
    return RequestRecord.start(NormalizedRequest(f"r{number}", "openai", "s", "x"), now=0.0, unix=0.0)


def test_records_since_gives_the_new_ones_of_those_kept() -> None:
    recent = RecentRecords(size=3)
    for number in range(2):
        recent.add(record(number))
    assert [r.id for r in recent.records_since(0)] == ["r0", "r1"]
    assert recent.records_since(2) == []
    for number in range(2, 6):
        recent.add(record(number))
    assert [r.id for r in recent.records_since(2)] == ["r3", "r4", "r5"]  # r2 fell out of the three kept
    assert [r.id for r in recent.records_since(5)] == ["r5"]


def test_judged_since_gives_the_new_judgements() -> None:
    recent = RecentRecords(size=2)
    assert recent.judged_since(0) == []
    for number in range(3):
        recent.judge(Judged(f"r{number}", "s", number))
    assert [j.request_id for j in recent.judged_since(0)] == ["r1", "r2"]
    assert [j.request_id for j in recent.judged_since(2)] == ["r2"]
