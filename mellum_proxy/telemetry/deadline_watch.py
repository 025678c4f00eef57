"""`DeadlineWatch`: one warning, now and then, when completions keep ending at the deadline before the
server's first token, so a person whose editor shows nothing learns why and what to change.

It reads finished records only (telemetry observes; it never steers). A streak of `IN_A_ROW` requests that
timed out without a first token says so, at most once every `EVERY_S`: the deadline, how long those
requests waited in the proxy's queue, the server's last measured time to first token, and the knobs. Where the
server was seen holding more requests than the proxy sent it (`others`, set by the live page's look while the
warning lasts), the other traffic is named first: chats or agents pointed at the server, not at the proxy.
"""

from __future__ import annotations

from mellum_proxy.models import Outcome
from mellum_proxy.telemetry.record import RequestRecord

IN_A_ROW = 3
EVERY_S = 300.0


class DeadlineWatch:
    def __init__(self, timeout_ms: int, in_a_row: int = IN_A_ROW, every_s: float = EVERY_S) -> None:
        self.timeout_ms = timeout_ms
        self.in_a_row = in_a_row
        self.every_s = every_s
        self.streak = 0
        self.queued_ms = 0.0  # of the streak, in the proxy's queue
        self.last_ttft_ms: float | None = None  # the last first token the server gave in time
        self.said_at: float | None = None
        self.others = 0  # requests the server held beyond the proxy's own, when last looked

    def observe(self, record: RequestRecord, now: float) -> str | None:
        """The warning to give for this finished request, if it is time for one."""
        if record.outcome is Outcome.OK and record.ttft_ms is not None:
            self.streak, self.queued_ms, self.others = 0, 0.0, 0
            self.last_ttft_ms = record.ttft_ms - (record.queue_ms or 0.0)
            return None
        if record.outcome is not Outcome.TIMEOUT or record.ttft_ms is not None:
            return None
        self.streak += 1
        self.queued_ms += record.queue_ms or 0.0
        if self.streak < self.in_a_row or (self.said_at is not None and now - self.said_at < self.every_s):
            return None
        self.said_at = now
        return self.message()

    def current(self) -> str | None:
        """The warning while the streak lasts (the live page shows it until a first token comes in time)."""
        return self.message() if self.streak >= self.in_a_row else None

    def message(self) -> str:
        queued = self.queued_ms / max(1, self.streak)
        server = (
            f"the server's last first token took {self.last_ttft_ms:.0f} ms"
            if self.last_ttft_ms is not None
            else "no completion has had a first token in time yet"
        )
        advice = (
            "raise max_concurrency or lower max_queue (they waited for a slot)"
            if queued > self.timeout_ms / 2
            else "raise timeout_ms (and the plugin's own timeout), lower max_context_tokens (less to prefill), "
            "or use a faster server (with --embedded: fewer embedded_threads when other programs keep the cores busy)"
        )
        if self.others:
            advice = (f"the server holds {self.others} request(s) beyond those the proxy has running there (another "
                      "program's, a chat or agent pointed at the server, or dropped ones it still finishes): point "
                      "that traffic at the proxy, which keeps a slot for completions (completion_reserve); or "
                      + advice)  # fmt: skip
        return (
            f"completions show nothing: {self.streak} in a row ended at the deadline (timeout_ms={self.timeout_ms}) "
            f"before the server's first token, after {queued:.0f} ms in the proxy's queue on average; {server}. "
            f"To see completions: {advice}"
        )
