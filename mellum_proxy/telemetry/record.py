"""`RequestRecord`: the facts of one client request, filled in as it goes and closed in `finally`.

Field names are stable (they are the request log's columns; see the README). No source text is
kept unless the user asked for it (`--log-content`): lengths and `prompt_sha256` instead (hashed
when the record is finished, off the way to the first token, and only when it is written to a log; without
`--log` nothing reads it).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from mellum_proxy.models import BudgetedPrompt, Completion, NormalizedRequest, Outcome
from mellum_proxy.observe import Changes
from mellum_proxy.telemetry.acceptance import Judged


def prompt_digest(request: NormalizedRequest) -> str:
    """First 16 hex digits of sha256 over prefix, a NUL, and suffix: equal prompts, equal digests."""
    digest = hashlib.sha256(request.prefix.encode())
    digest.update(b"\0" + (request.suffix or "").encode())
    return digest.hexdigest()[:16]


@dataclass(slots=True)
class RequestRecord:
    id: str
    session: str
    dialect: str  # the route it came in by (`NormalizedRequest.route`), under the request log's old key
    received_at: float  # unix seconds
    started: float  # `Clock.now()` at arrival, for durations; not logged
    outcome: Outcome | None = None
    debounce_ms: float | None = None
    queue_ms: float | None = None
    queue_depth: int | None = None
    inflight: int | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_chars: int = 0
    suffix_chars: int = 0
    prompt_sha256: str = ""
    edit_region: str | None = None  # the edit-prediction format of a prompt passed through untouched
    max_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    upstream_status: int | None = None
    upstream: str | None = None  # which upstream answered, when there are several (or one)
    model: str | None = None  # the model the answer names (a router's workers can be told apart by it)
    prompt_tokens_before: int | None = None
    prompt_tokens_after: int | None = None
    truncated: bool | None = None
    tokenizer: str | None = None
    reached_upstream: bool = False  # a request was opened to the model server
    error: str | None = None  # what failed it: its type (`upstream_unreachable`: no connection could be made)
    cleaned: str | None = None  # the post-processing rule that ended or trimmed the completion
    vram_used_mib_start: float | None = None
    vram_used_mib_end: float | None = None
    vram_peak_mib: float | None = None
    vram_source: str = "none"
    content: dict[str, str | None] | None = None  # only with --log-content
    lane: str = "completion"  # or "bulk": chat, agents, tools passed through (`queue_ms` its wait for a slot)
    wake_ms: float | None = None  # it waited this long for the server to wake (it slept, or this request woke it)
    draft_n: int | None = None  # tokens the server's speculation drafted for it (llama.cpp's `timings`)
    draft_n_accepted: int | None = None  # of which the model accepted

    @classmethod
    def start(
        cls, request: NormalizedRequest, now: float, unix: float, log_content: bool = False, digest: bool = False
    ) -> RequestRecord:
        """A record at arrival; `digest`: hash the prompt now (else `Telemetry.finish` does, for a logged one)."""
        return cls(
            id=request.id,
            session=request.session,
            dialect=request.route,
            received_at=unix,
            started=now,
            prompt_chars=len(request.prefix),
            suffix_chars=len(request.suffix or ""),
            prompt_sha256=prompt_digest(request) if digest else "",
            edit_region=request.edit_region,
            max_tokens=request.max_tokens,
            content={"prompt": request.prefix, "suffix": request.suffix} if log_content else None,
        )

    # The events of a request, in the order they happen: the record is filled here and nowhere else.

    def arrived(self, queue_depth: int, inflight: int) -> None:
        self.queue_depth, self.inflight = queue_depth, inflight

    def held(self, ms: float) -> None:
        """The dispatch hold (debounce) let it go after `ms`."""
        self.debounce_ms = ms

    def fitted(self, prompt: BudgetedPrompt) -> None:
        """The context budget fitted it to `prompt`."""
        self.prompt_tokens_before, self.prompt_tokens_after = prompt.tokens_before, prompt.tokens_after
        self.truncated, self.tokenizer = prompt.truncated, prompt.method

    def woke(self, ms: float) -> None:
        """It waited `ms` for a sleeping server to load its model."""
        self.wake_ms = ms

    def queued(self, ms: float) -> None:
        """It waited `ms` for an upstream slot."""
        self.queue_ms = ms

    def sent(self) -> None:
        """A request to the model server was opened for it."""
        self.reached_upstream = True

    def mark_first_token(self, now: float) -> None:
        if self.ttft_ms is None:
            self.ttft_ms = (now - self.started) * 1000.0

    def cleaned_by(self, rule: str) -> None:
        """A post-processing rule ended (or trimmed) the completion."""
        self.cleaned = rule

    def answered(self) -> None:
        """The model server's answer ended well."""
        self.upstream_status = 200

    def ended(self, outcome: Outcome, upstream_status: int | None = None, error: str | None = None) -> None:
        self.outcome = outcome
        if upstream_status is not None:
            self.upstream_status = upstream_status
        if error is not None:
            self.error = error

    def gpu_window(self, source: str, start_mib: float | None) -> None:
        self.vram_source, self.vram_used_mib_start = source, start_mib

    def gpu_window_closed(self, end_mib: float | None, peak_mib: float | None) -> None:
        self.vram_used_mib_end, self.vram_peak_mib = end_mib, peak_mib

    def close(self, completion: Completion, now: float) -> None:
        """Take the totals from what the upstream produced."""
        self.total_ms = (now - self.started) * 1000.0
        usage = completion.usage or {}
        self.prompt_tokens = usage.get("prompt_tokens")
        self.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        self.cached_tokens = details.get("cached_tokens")
        timings = completion.timings
        if timings:
            if self.cached_tokens is None:  # llama.cpp's own: the prompt tokens it reused
                cache_n = timings.get("cache_n")
                self.cached_tokens = cache_n if isinstance(cache_n, int) else None
            drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")  # with speculation only
            if type(drafted) is int and type(accepted) is int:
                self.draft_n, self.draft_n_accepted = drafted, accepted
        self.upstream = completion.served_by
        self.model = completion.model or None
        if self.content is not None:
            self.content["completion"] = completion.text

    def as_dict(self) -> dict[str, Any]:
        """The log line (`event: request`, as every line of the log names its kind): every field but the
        monotonic clock; content fields only when recorded."""
        data: dict[str, Any] = {"event": "request"}
        for name in _LOGGED:  # not `asdict`, which copies every value deeply: 34 us a record against 3
            data[name] = getattr(self, name)
        if self.content is not None:
            data.update(self.content)
        return data


class RecentRecords:
    """The last `size` finished records, newest last, and the last `size` suggestions judged (for /status,
    the live page and tests)."""

    def __init__(self, size: int = 256) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=size)
        self.added = 0
        self._judged: deque[Judged] = deque(maxlen=size)
        self.judged_count = 0
        self.changes = Changes()

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)
        self.added += 1
        self.changes.notify()

    def judge(self, judged: Judged) -> None:
        self._judged.append(judged)
        self.judged_count += 1
        self.changes.notify()

    def records_since(self, added: int) -> list[RequestRecord]:
        """The records added after the first `added` ones, of those still kept."""
        count = min(self.added - added, len(self._records))
        return list(self._records)[len(self._records) - count :] if count > 0 else []

    def judged_since(self, count: int) -> list[Judged]:
        """The judgements made after the first `count`, of those still kept."""
        new = min(self.judged_count - count, len(self._judged))
        return list(self._judged)[len(self._judged) - new :] if new > 0 else []

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def last(self) -> RequestRecord:
        """The newest record.

        Raises:
            LookupError: none was recorded yet.
        """
        if not self._records:
            raise LookupError("no request recorded yet")
        return self._records[-1]


_LOGGED = tuple(spec.name for spec in fields(RequestRecord) if spec.name not in ("started", "content"))
