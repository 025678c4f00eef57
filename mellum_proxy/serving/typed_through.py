"""A keystroke that typed through an earlier completion, answered from that completion: its rest after what
was typed, exactly, cut by this request's own `max_tokens` and stop strings and cleaned as a completion of its
own. A finished completion answers at once; one still streaming is followed (`relay.AfterTyped`) under the
session's admission and this request's deadline, as any request is."""

from __future__ import annotations

import dataclasses
import math

from mellum_proxy.models import Answer, Chunk, Completion, NormalizedRequest, Outcome
from mellum_proxy.serving.flight import Flights
from mellum_proxy.serving.policy_set import Policies, admitted
from mellum_proxy.serving.relay import AfterTyped, first_text, relay
from mellum_proxy.serving.reuse import Hit, rest_end, tokens_in
from mellum_proxy.shaping.cleanup import Cleaner
from mellum_proxy.telemetry import RequestRecord, Telemetry


class TypedThrough:
    """Answers typed-through keystrokes for one service (its policies, flights and telemetry)."""

    def __init__(self, policies: Policies, flights: Flights, telemetry: Telemetry, max_tokens_cap: int) -> None:
        self.policies, self.flights, self.telemetry = policies, flights, telemetry
        self.clock = policies.clock
        self.max_tokens_cap = max_tokens_cap  # the proxy's own cap on what a request may ask for

    async def answer(
        self, request: NormalizedRequest, hit: Hit, answer: Answer, completion: Completion, record: RequestRecord,
        order: float = math.inf,
    ) -> Outcome | None:  # fmt: skip
        """Answer from an earlier completion the person typed through; None when it turned out not to fit
        before anything was sent (the request then goes on as usual)."""
        policies = self.policies
        flight = hit.entry.flight
        source = flight.completion
        # whose completion this is the rest of; not an upstream answer of its own, so served by none
        completion.origin = dataclasses.replace(source.origin, served_by=None)
        max_tokens, stops = self._asked(request)
        if flight.ended:
            rest = hit.rest(cut=flight.cut_short)
            if rest is None:
                return None
            finish: str | None = (source.finish_reason or "stop") if flight.ended_on_its_own else "length"
            end, why = rest_end(flight, len(hit.typed), max_tokens, stops)
            if end is not None and end - len(hit.typed) < len(rest):
                rest, finish = rest[: end - len(hit.typed)], why
            if self.policies.postprocess:  # the remainder is cleaned as a completion of its own
                clean = Cleaner(request.prefix, request.suffix)
                rest = clean.feed(rest) + clean.finish()
                if clean.stopped is not None:
                    finish = "stop"
                    record.cleaned_by(clean.stopped)
            if not rest:
                return None
            completion.count_usage(0, tokens_in(flight, len(hit.typed), len(hit.typed) + len(rest)))  # none evaluated
            return await self._send(completion, answer, record, rest, finish)
        # Still streaming: follow it (a newer keystroke supersedes this request as it would any other).
        flight.listeners += 1
        cleaner = Cleaner(request.prefix, request.suffix) if policies.postprocess else None
        try:
            with admitted(policies, request.session, order) as entry:
                shown = first_text(self.telemetry, record, entry.ticket, entry.deadline)
                view = AfterTyped(hit.typed, max_tokens, stops, cleaner, shown)
                await relay(flight, view, answer, completion)
            if cleaner is not None and cleaner.stopped is not None:
                record.cleaned_by(cleaner.stopped)
            if entry.cut is not None:
                return entry.cut
        finally:
            self.flights.leave(flight, drop=cleaner is not None and cleaner.stopped is not None)
        if not view.sent:
            return None
        completion.count_usage(0, tokens_in(flight, len(hit.typed), len(hit.typed) + view.taken))
        ended = (source.finish_reason or "stop") if flight.ended_on_its_own else "length"
        completion.finish_reason = view.limited or ended
        return Outcome.REUSED

    def _asked(self, request: NormalizedRequest) -> tuple[int | None, list[str]]:
        """What this request's own answer may hold: at most this many tokens, up to these stop strings."""
        cap = self.max_tokens_cap
        max_tokens = cap if request.max_tokens is None else min(request.max_tokens, cap)
        stop = request.params.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]
        return max_tokens, stops

    async def _send(
        self, completion: Completion, answer: Answer, record: RequestRecord, rest: str, finish: str | None
    ) -> Outcome:
        chunk = Chunk(rest, finish_reason=finish or "stop")
        completion.add(chunk)
        self.telemetry.first_token(record)
        await answer.send(completion, [chunk])
        return Outcome.REUSED
