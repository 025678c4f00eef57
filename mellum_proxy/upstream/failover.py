"""`Upstreams`: several model servers in order of preference; the first one that is up serves.

A team's router first, the developer's own server (or the embedded one) after it: when the one
serving refuses the connection, answers 5xx, answers something that is no completion (a captive
portal's HTML page, events it cannot read) or does not start its answer in time, before the first
token, the request is sent again to the next one, and that upstream is marked down (a circuit breaker:
no later request waits on it). "In time", when there is a next one, is `failover_answer_s`: a share of
the request's deadline, so a server that answers `/health` but never a completion is left while the
next one can still answer. One request cannot take the last upstream that is up down with it: a
request that makes the only healthy server fail is that request's failure, not the server's.
A health check every `interval_s` brings a down upstream back as soon as it answers, and takes one
that stopped answering out; one that failed requests comes back only after a wait that doubles with each
failure in a row (its `/health` may be fine while its completions are not). A failure after the first
token cannot be retried (the editor has the start of the answer): it is the client's error, as with one
upstream.

With one upstream nothing here changes what the proxy does: there is nothing to fail over to.
"""

from __future__ import annotations

import asyncio
import logging
import time
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

log = logging.getLogger("mellum_proxy")

SERVED_KEPT = 4096  # request ids whose serving upstream is kept until the service asks
FAILOVER_ANSWER_MIN_S = 0.25
COMEBACK_MAX = 32  # health periods: the longest an upstream that keeps failing completions waits to come back


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

    def status(self, serving: bool) -> dict[str, Any]:
        return {
            "url": self.client.shown_url,
            "up": self.up,
            "serving": serving,
            "served": self.served,
            "failed": self.failed,
            "last_error": self.last_error,
            "since": round(self.since, 3),
        }


class Upstreams:
    """The upstreams in order; each call goes to the one serving now (`client`)."""

    def __init__(
        self, clients: Sequence[UpstreamClient], failover_answer_s: float | None = None, interval_s: float = 1.0
    ) -> None:
        """`failover_answer_s`: how long an upstream with a fallback after it may take to start its answer (None:
        its own `answer_timeout_s`); `interval_s`: the health checks' period, the unit of the wait before an
        upstream that failed completions is brought back."""
        if not clients:
            raise ValueError("at least one upstream")
        self.members = [Member(client) for client in clients]
        self.failover_answer_s = failover_answer_s
        self.interval_s = interval_s
        self.on_up: Callable[[UpstreamClient], Awaitable[None]] | None = None  # rediscover a returning one
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
        for index, member in enumerate(candidates):
            started = False
            answer_s = self.failover_answer_s if index < len(candidates) - 1 else None
            try:
                batches = member.client.stream_completion(request, prompt, answer_s)
                async with aclosing(batches):
                    first = await first_answer(batches, member.client, request, answer_s)
                    started = True
                    self._remember(request.id, member)
                    if first:
                        yield first
                    async for batch in batches:
                        yield batch
            except UpstreamError as error:
                if started or not worth_failing_over(error):
                    raise
                member.failed += 1
                if any(other.up for other in self.members if other is not member):  # never the last one up
                    member.strikes += 1
                    member.down_at = asyncio.get_running_loop().time()
                    self._down(member, error.message if self.reveal else error.shown)
                first_error = first_error or error
                if index == len(candidates) - 1:
                    self._remember(request.id, member)  # the record names the last one asked
                    raise first_error from error  # the one that was asked first says most
                continue
            member.served += 1
            member.strikes = 0
            return

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
            self.changes.notify()
            if len(self.members) == 1:
                log.info("upstream %s answers again", member.client.shown_url)
            else:
                log.info("upstream %s is back; serving from %s", member.client.shown_url, self.serving.client.shown_url)
            if self.on_up is not None:
                await self.on_up(member.client)

    async def check(self) -> None:
        """One health check of every member, at once."""
        problems = await asyncio.gather(*(answer_problem(m.client) for m in self.members))
        now = asyncio.get_running_loop().time()
        for member, problem in zip(self.members, problems, strict=True):
            if problem is None and now - member.down_at >= self.comeback_s(member):
                await self._up(member)
            elif problem is not None:
                self._down(member, f"health check: {problem}")
            else:
                self._down(member, "waiting after failed completions")

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
