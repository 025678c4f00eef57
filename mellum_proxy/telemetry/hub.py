"""`Telemetry`: where the service hands each request's record; it fans out to the sinks.

It observes and never steers: no sink can change or fail a request.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from mellum_proxy.budget.templates import cursor_of
from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.errors import ProxyError
from mellum_proxy.models import Completion, NormalizedRequest, Outcome
from mellum_proxy.telemetry.acceptance import AcceptanceTracker, Judged
from mellum_proxy.telemetry.deadline_watch import DeadlineWatch
from mellum_proxy.telemetry.gpu import GpuSampler
from mellum_proxy.telemetry.jsonl import JsonlLog
from mellum_proxy.telemetry.prometheus import ProxyMetrics
from mellum_proxy.telemetry.record import RecentRecords, RequestRecord, prompt_digest

log = logging.getLogger("mellum_proxy")
BULK_KEPT = 256


@dataclass(eq=False)
class Telemetry:
    """The sinks: the recent records (`/status`), the GPU sampler, the request log (`--log`), the metrics, the
    recording (`--record`) and the deadline watch."""

    records: RecentRecords
    gpu: GpuSampler | None = None
    log: JsonlLog | None = None
    metrics: ProxyMetrics | None = None
    log_content: bool = False
    recorder: JsonlLog | None = None
    clock: Clock = LOOP_CLOCK
    deadline_watch: DeadlineWatch | None = None
    acceptance: AcceptanceTracker = field(default_factory=AcceptanceTracker)
    bulk: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=BULK_KEPT))  # the last bulk requests
    bulk_added: int = 0  # bulk requests finished since start (the live page reads those it has not seen)

    def sinks(self) -> list[JsonlLog]:
        """The files requests are written to (`--log`, `--record`)."""
        return [sink for sink in (self.log, self.recorder) if sink is not None]

    def start(self, request: NormalizedRequest, arrived: float | None = None) -> RequestRecord:
        clock = self.clock
        now, unix = clock.now(), clock.unix()
        if arrived is not None:  # the edge saw it first (its body still to read)
            now, unix = arrived, unix - max(0.0, now - arrived)
        record = RequestRecord.start(request, now, unix, self.log_content)
        if self.recorder is not None:
            self.recorder.put(arrival(request, record.received_at, self.log_content))
        if self.gpu is not None:
            window = self.gpu.start_window(id(record))
            record.gpu_window(self.gpu.source, window.start_mib)
        if (judged := self.acceptance.arrived(request)) is not None:
            self._judged(judged)
        return record

    def first_token(self, record: RequestRecord) -> None:
        record.mark_first_token(self.clock.now())

    def finish(self, record: RequestRecord, completion: Completion, request: NormalizedRequest | None = None) -> None:
        """`record` is over; `request`: its request, whose prompt a logged record is given the digest of (hashed
        here, after the answer, not on the way to its first token)."""
        record.close(completion, self.clock.now())
        if request is not None and self.log is not None:
            record.prompt_sha256 = prompt_digest(request)
        if self.gpu is not None:
            window = self.gpu.end_window(id(record))
            record.gpu_window_closed(window.end_mib, window.peak_mib)
        self.records.add(record)
        if self.metrics is not None:
            self.metrics.observe(record)
        if self.log is not None:
            self.log.put(record.as_dict())
        shown = completion if record.outcome is Outcome.OK else None
        if judged := self.acceptance.shown(record.id, record.session, shown, record.outcome is Outcome.REUSED):
            self._judged(judged)
        if self.deadline_watch is not None:
            warning = self.deadline_watch.observe(record, self.clock.now())
            if warning is not None:
                log.warning("%s", warning)

    def start_bulk(self, request_id: str, session: str, route: str) -> RequestRecord:
        """The record of a bulk request (chat, agents: passed through): lengths and times, never its text."""
        return RequestRecord(request_id, session, route, self.clock.unix(), self.clock.now(), lane="bulk")

    def finish_bulk(self, record: RequestRecord) -> None:
        """A bulk request ended: to the log and the metrics, and kept for `/status`'s lane waits (not with the
        completions, whose figures, judgements and warnings it would muddle)."""
        record.total_ms = (self.clock.now() - record.started) * 1000.0
        self.bulk.append(record)
        self.bulk_added += 1
        if self.metrics is not None:
            self.metrics.observe_bulk(record)
        if self.log is not None:
            self.log.put(record.as_dict())
        self.records.changes.notify()  # the live page's state, and whoever waits on a lane

    def bulk_since(self, added: int) -> list[RequestRecord]:
        """The bulk records finished after the first `added` (those still kept)."""
        new = min(self.bulk_added - added, len(self.bulk))
        return list(self.bulk)[len(self.bulk) - new :] if new > 0 else []

    def settle(self) -> None:
        """Judge every suggestion still open, by what was seen (at shutdown, before the log closes)."""
        for judged in self.acceptance.settle_all():
            self._judged(judged)

    def _judged(self, judged: Judged) -> None:
        """A suggestion is settled: its own log line (the request's was written when it ended), the counters,
        the live page."""
        self.records.judge(judged)
        if self.metrics is not None:
            self.metrics.accepted(judged.accepted_chars)
        if self.log is not None:
            self.log.put({"event": "acceptance", "id": judged.request_id, "session": judged.session,
                          "accepted_chars": judged.accepted_chars,
                          "received_at": self.clock.unix()})  # fmt: skip

    def reject(self, request: NormalizedRequest, error: ProxyError) -> None:
        """Record a request that failed before the completion service had it (`bad_request`, or
        `upstream_error` for a 5xx)."""
        record = self.start(request)
        outcome = Outcome.BAD_REQUEST if error.status < 500 else Outcome.UPSTREAM_ERROR
        record.ended(outcome, error.upstream_status, error.kind)
        self.finish(record, Completion(id=f"cmpl-{request.id}"), request)


def arrival(request: NormalizedRequest, at: float, with_text: bool) -> dict[str, object]:
    """One line of `serve --record`: when a request arrived and what it was, text only if asked. A prompt the
    client rendered with FIM markers is recorded as the text before and after its cursor, so that the typing
    in it can be read back (`mellum_proxy.tuning.workloads.convert.from_recording`)."""
    file, prefix, suffix = cursor_of(request) or (request.file_path, request.prefix, "")
    line: dict[str, object] = {
        "t": at,
        "session": request.session,
        "dialect": request.route,
        "file": file,
        "prefix_chars": len(prefix),
        "suffix_chars": len(suffix),
    }
    if with_text:
        line["prompt"] = prefix
        line["suffix"] = suffix
    return line
