"""`Upstreams`: several model servers in order of preference; the first one that is up serves.

A team's router first, the developer's own server (or the embedded one) after it: when the one
serving refuses the connection, answers 5xx, answers something that is no completion (a captive
portal's HTML page, events it cannot read) or does not start its answer in time, before the first
token, the request is sent again to the next one. One request cannot take the last upstream that is up down
with it: a request that makes the only healthy server fail is that request's failure, not the server's.

"In time" is judged by each member's own recent first answers, not by a fixed share of the deadline: a member
is waited for as long as the next one still has the time it needs (its own recent first-answer times, twice
their median, or a third of the deadline while it has answered too few) within the request's deadline, and at
least twice its own median, so a member that answers within the deadline keeps serving however slow. Where the
next one could not answer in what would be left, the request is not failed over at all: it waits for the one it
asked (a failover then only emptied the answer: a primary at 0.6 s and a fallback at 1.2 s under a 1.5 s deadline
gave 8 empty answers in 80).

A member is taken down (a circuit breaker: no later request waits on it) when it refuses or answers 5xx or
garbage, and on timeouts only when its recent requests show it: it has never answered, or timed out twice of its
last four. A health check every `interval_s` brings a down upstream back as soon as it answers, and takes one that
stopped answering out; one that failed requests comes back only after a wait that doubles with each failure in a
row (its `/health` may be fine while its completions are not), and sheds that record only after
`TRUSTED_AFTER` answers in a row. A failure after the first token cannot be retried (the editor has the start of
the answer): it is the client's error, as with one upstream.

With one upstream nothing here changes what the proxy does: there is nothing to fail over to.

Servers that sleep are read and woken by `mellum_proxy.upstream.sleep` (the health watch reads, a completion wakes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from mellum_proxy.errors import (
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from mellum_proxy.models import Batches, BudgetedPrompt, Chunk, NormalizedRequest
from mellum_proxy.observe import Changes
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.health import answer_problem
from mellum_proxy.upstream.sleep import Sleep

log = logging.getLogger("mellum_proxy")

SERVED_KEPT = 4096  # request ids whose serving upstream is kept until the service asks
FAILOVER_ANSWER_MIN_S = 0.25
COMEBACK_MAX = 32  # health periods: the longest an upstream that keeps failing completions waits to come back
RECENT = 8  # first-answer times kept per member
KNOWN_AFTER = 3  # answers before a member's own times are trusted over the share of the deadline
TRUSTED_AFTER = 3  # answers in a row before a member that failed sheds its strikes
SLACK = 2.0  # a member is given twice its median first answer
IDENTITY_CHECKS = 30  # health checks between two askings of what each server is (one back with another model)


def failover_answer_s(timeout_s: float | None, answer_timeout_s: float | None) -> float | None:
    """How long an upstream with a fallback after it may take to start a completion's answer: a third of the
    request's deadline (at least `FAILOVER_ANSWER_MIN_S`), leaving the rest to the next one, and never longer
    than `answer_timeout_s`. llama.cpp and vLLM send their headers at once, before the prefill's result."""
    if timeout_s is None:
        return answer_timeout_s
    share = max(FAILOVER_ANSWER_MIN_S, timeout_s / 3)
    return share if answer_timeout_s is None else min(share, answer_timeout_s)


def worth_failing_over(error: UpstreamError) -> bool:
    """The upstream is down or broken, not the request: unreachable, silent, speaking no completion
    protocol, or a 5xx of its own (a 4xx is about the request)."""
    if isinstance(error, UpstreamUnavailableError | UpstreamTimeoutError | UpstreamProtocolError):
        return True
    return isinstance(error, UpstreamStatusError) and error.upstream_status >= 500


async def first_answer(
    batches: Batches, client: UpstreamClient, request: NormalizedRequest, within_s: float | None
) -> list[Chunk]:
    """The chunks of `batches` up to its first with text or a finish reason, which must come within `within_s`
    (None: no limit here). A coroutine, not another generator: the batches after it go out as they come.

    Raises:
        UpstreamTimeoutError: no such chunk within `within_s`.
        UpstreamProtocolError: the stream ended without one (a warm-up request, which asks for nothing, aside).
    """
    held: list[Chunk] = []
    deadline = None if within_s is None else asyncio.get_running_loop().time() + within_s
    try:
        async with asyncio.timeout_at(deadline):
            async for batch in batches:
                held.extend(batch)
                if any(chunk.has_text or chunk.finish_reason is not None for chunk in batch):
                    return held
    except TimeoutError as exc:
        raise UpstreamTimeoutError(
            f"upstream {client.shown_url} started no completion within {within_s or 0:.2f} s"
        ) from exc
    if not request.warm_up:
        raise UpstreamProtocolError(f"upstream {client.shown_url} ended its answer without any text or finish reason "
                                    "(an empty event stream)")  # fmt: skip
    return held


@dataclass(slots=True)
class Member:
    """One upstream and what the proxy saw of it."""

    client: UpstreamClient
    up: bool = True
    served: int = 0  # completions it answered
    failed: int = 0  # completions it failed before their first token (each sent on to the next one)
    last_error: str | None = None
    since: float = field(default_factory=time.time)  # when `up` last changed (unix seconds)
    strikes: int = 0  # completions failed in a row: each doubles the wait before a health check brings it back
    down_at: float = 0.0  # the loop's time when a completion's failure took it down
    streak: int = 0  # answers in a row since its last failure
    sleep: Sleep = field(default_factory=Sleep)  # whether it sleeps, and its wakes
    first_answers: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))  # seconds, newest last
    timeouts: deque[bool] = field(default_factory=lambda: deque(maxlen=4))  # its last attempts: timed out or not

    def typical_s(self) -> float | None:
        """The median of its recent first answers (None: too few to say)."""
        if len(self.first_answers) < KNOWN_AFTER:
            return None
        ordered = sorted(self.first_answers)
        return ordered[len(ordered) // 2]

    def answered(self, seconds: float) -> None:
        self.first_answers.append(seconds)
        self.timeouts.append(False)
        self.streak += 1
        if self.streak >= TRUSTED_AFTER:
            self.strikes = 0

    def looks_down(self, error: UpstreamError) -> bool:
        """Whether this failure says the member is down: any but a timeout does; a timeout when it has never
        answered, or it is its second in its last four attempts."""
        self.streak = 0
        if not isinstance(error, UpstreamTimeoutError):
            return True
        self.timeouts.append(True)
        return not self.first_answers or sum(self.timeouts) >= 2

    def status(self, serving: bool) -> dict[str, Any]:
        return {
            "url": self.client.shown_url,
            "up": self.up,
            "serving": serving,
            "served": self.served,
            "failed": self.failed,
            "last_error": self.last_error,
            "since": round(self.since, 3),
            **self.sleep.status(),
        }


class Upstreams:
    """The upstreams in order; each call goes to the one serving now (`client`)."""

    def __init__(
        self,
        clients: Sequence[UpstreamClient],
        failover_answer_s: float | None = None,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> None:
        """`failover_answer_s`: what a member that has answered too few requests is assumed to need to start its
        answer (None: no limit but its own `answer_timeout_s`); `interval_s`: the health checks' period, the
        unit of the wait before an upstream that failed completions is brought back; `timeout_s`: a request's
        deadline (None: none), within which a failover must leave the next member the time it needs."""
        if not clients:
            raise ValueError("at least one upstream")
        self.members = [Member(client) for client in clients]
        self.failover_answer_s = failover_answer_s
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.on_up: Callable[[UpstreamClient], Awaitable[None]] | None = None  # rediscover a returning one
        # ask one that may have restarted what it is now: after a closed pooled connection, every IDENTITY_CHECKS
        self.on_restart: Callable[[UpstreamClient], Awaitable[None]] | None = None
        self._checks = 0  # health checks made
        self._served: dict[str, str] = {}
        self.changes = Changes()  # notified when one goes down or comes back
        self.reveal = False  # an upstream's own error text in `last_error` and the console (`--log-content`)

    @property
    def primary(self) -> UpstreamClient:
        return self.members[0].client

    @property
    def serving(self) -> Member:
        """The first member that is up; the first of all when none is (it may be back by now)."""
        return next((m for m in self.members if m.up), self.members[0])

    @property
    def client(self) -> UpstreamClient:
        return self.serving.client

    @property
    def shown_url(self) -> str:
        return self.client.shown_url

    def status(self) -> list[dict[str, Any]]:
        serving = self.serving
        return [member.status(member is serving) for member in self.members]

    def served_by(self, request_id: str) -> str | None:
        """The upstream that answered this request (once), for its record."""
        return self._served.pop(request_id, None)

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
        """The completion from the first member that is up; on to the next one while none has answered.

        An answer is its first chunk with text or a finish reason: a member with a fallback after it must send
        one within `failover_answer_s` (headers alone are no answer), and a stream that ends before one is the
        member's failure too (`UpstreamProtocolError`), whichever member it is.

        Raises:
            UpstreamError: the last one tried failed, or one failed after its first chunk.
        """
        # Those up, in order; all of them when none is (they may be back by now).
        candidates = [m for m in self.members if m.up] or list(self.members)
        first_error: UpstreamError | None = None
        loop = asyncio.get_running_loop()
        began = loop.time()
        for index, member in enumerate(candidates):
            started = False
            following = candidates[index + 1] if index < len(candidates) - 1 else None
            answer_s = self.wait_s(member, following, loop.time() - began)
            asked = loop.time()
            try:
                batches = member.client.stream_completion(request, prompt, answer_s)
                async with aclosing(batches):
                    first = await first_answer(batches, member.client, request, answer_s)
                    started = True
                    member.answered(loop.time() - asked)
                    self._remember(request.id, member)
                    if first:
                        yield first
                    async for batch in batches:
                        yield batch
            except UpstreamError as error:
                if started or not worth_failing_over(error):
                    raise
                member.failed += 1
                down = member.looks_down(error)
                if down and any(other.up for other in self.members if other is not member):  # never the last one up
                    member.strikes += 1
                    member.down_at = loop.time()
                    self._down(member, error.message if self.reveal else error.shown)
                first_error = first_error or error
                if index == len(candidates) - 1:
                    self._remember(request.id, member)  # the record names the last one asked
                    raise first_error from error  # the one that was asked first says most
                continue
            member.served += 1
            member.sleep.answered(member.client, loop.time(), self.changes)
            return

    @property
    def wakes(self) -> int:
        """The wakes of every member so far."""
        return sum(member.sleep.wakes for member in self.members)

    @property
    def cache_per_slot(self) -> bool:
        """Whether the serving upstream keeps a prompt cache per slot (llama.cpp): after a wake, the others empty."""
        return self.serving.client.kind.cache_per_slot

    async def close(self) -> None:
        """Stop what its members' sleeps still have to do (a save of prompt caches): before the session closes."""
        for member in self.members:
            await member.sleep.close()

    async def awake(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> float | None:
        """Before a completion is sent: the serving member awake (`mellum_proxy.upstream.sleep.Sleep.awake`)."""
        member = self.serving
        return await member.sleep.awake(member.client, request, prompt, self.changes, self.reveal)

    def wait_s(self, member: Member, following: Member | None, spent_s: float) -> float | None:
        """How long `member` may take to start its answer before the request goes on to `following` (None: no
        limit here but its `answer_timeout_s`: the last one, or one that no failover could beat in time)."""
        if following is None:
            return None
        if self.timeout_s is None:
            return self.failover_answer_s
        left = self.timeout_s - spent_s
        known = following.typical_s()
        needs = max(FAILOVER_ANSWER_MIN_S, SLACK * known) if known is not None else self.failover_answer_s
        wait = left - (needs or 0.0)
        if wait < FAILOVER_ANSWER_MIN_S:
            return None  # the next one could not answer in what would be left: a failover would only empty it
        own = member.typical_s()
        if own is not None:
            wait = max(wait, min(left, SLACK * own))  # slow but answering within the deadline: it keeps serving
        return wait

    def _remember(self, request_id: str, member: Member) -> None:
        if len(self._served) >= SERVED_KEPT:
            self._served.pop(next(iter(self._served)))
        self._served[request_id] = member.client.shown_url

    def mark_down(self, member: Member, why: str) -> None:
        """`member` cannot serve (`why`, in words): said once, on the console, until it is up again."""
        self._down(member, why)

    def _down(self, member: Member, why: str) -> None:
        if member.up:
            member.up, member.since, member.last_error = False, time.time(), why
            self.changes.notify()
            after = self.serving
            if len(self.members) == 1:
                log.warning("upstream %s does not answer (%s); completions fail until it does: start the server, "
                            "or point --upstream at it", member.client.shown_url, why)  # fmt: skip
            else:
                log.warning("upstream %s is down (%s); serving from %s", member.client.shown_url, why,
                            after.client.shown_url if after.up else "none: every upstream is down")  # fmt: skip

    async def _up(self, member: Member) -> None:
        if not member.up:
            member.up, member.since = True, time.time()
            if len(self.members) == 1:
                log.info("upstream %s answers again", member.client.shown_url)
            else:
                log.info("upstream %s is back; serving from %s", member.client.shown_url, self.serving.client.shown_url)
            member.client.reconnected = False
            if self.on_up is not None:
                await self.on_up(member.client)
            self.changes.notify()

    async def check(self) -> None:
        """One health check of every member, at once; one that may have restarted is asked what it is now."""
        problems = await asyncio.gather(*(answer_problem(m.client) for m in self.members))
        now = asyncio.get_running_loop().time()
        self._checks += 1
        for member, problem in zip(self.members, problems, strict=True):
            if problem is None and now - member.down_at >= self.comeback_s(member):
                was_up = member.up
                await self._up(member)
                restarted = member.client.reconnected or self._checks % IDENTITY_CHECKS == 0
                if was_up and restarted and self.on_restart is not None:
                    member.client.reconnected = False
                    await self.on_restart(member.client)
                    self.changes.notify()
            elif problem is not None:
                member.sleep.asleep = False  # what it said of its sleep is over: it may come back another server
                self._down(member, f"health check: {problem}")
            else:
                self._down(member, "waiting after failed completions")
        serving = self.serving
        if serving.up:
            await serving.sleep.read(serving.client, self.changes)
        self.changes.notify()  # a check was made (tests wait on checks, not on the clock)

    def comeback_s(self, member: Member) -> float:
        """How long after a completion took `member` down a healthy `/health` may bring it back: 0 after none,
        then one check period doubled with each failure in a row, at most `COMEBACK_MAX` periods."""
        if member.strikes == 0 or member.up:
            return 0.0
        return self.interval_s * float(min(COMEBACK_MAX, 2 ** (member.strikes - 1)))

    async def watch(self, interval_s: float) -> None:
        """Check every member every `interval_s`, for the app's lifetime: what changes is said on the console
        (a lone upstream too: the user learns that the server went away, and when it answers again)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.check()
            except Exception:  # a check must never end the watch
                log.exception("upstream health check failed")

    # What the rest of the proxy asks of "the upstream": the one serving now.

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        return await self.client.let_go(accept, timeout_s)

    async def tokenize(self, body: dict[str, Any], timeout_s: float = 5.0) -> Any:
        return await self.client.tokenize(body, timeout_s)

    async def model_ids(self) -> list[str]:
        return await self.client.model_ids()
