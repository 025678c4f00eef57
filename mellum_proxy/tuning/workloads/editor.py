"""The simulated editor plugin and the accounting of what the person at the keyboard saw.

On every edit the plugin sends one completion request for the cursor position (its own debounce
configurable, default none, like llama.vim) and cancels its previous request if that is still open
(configurable; Continue, llama.vim and Tabby cancel, llama.vscode does not).

A completion is **shown** if it arrives before the next edit of its file and its text is non-empty. A
**pause** is a gap of at least `pause_ms` before the next edit (the last edit is one too): the user is
waiting. A pause is **covered** when the request of the edit that began it was shown.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from mellum_proxy.budget.templates import MELLUM, FimParts
from mellum_proxy.telemetry.stats import percentile

PREFIX_LINES, SUFFIX_LINES = 100, 30  # the simulated plugin's window around the cursor


@dataclass(slots=True)
class RequestResult:
    edit: int  # index of the edit that triggered it
    file: str
    sent_ms: float
    done_ms: float | None = None
    text: str = ""
    status: int | None = None
    outcome: str | None = None  # the proxy's X-Mellum-Outcome, when there is a proxy
    completion_tokens: int = 0
    cancelled: bool = False  # by the plugin itself
    error: str | None = None


@dataclass(frozen=True, slots=True)
class EditMark:
    index: int
    file: str
    t_ms: float


@dataclass
class Accounting:
    edits: int
    requests: int
    shown: int
    pauses: int
    covered: int
    latencies_ms: list[float] = field(default_factory=list)
    covered_pauses: list[int] = field(default_factory=list)  # the edit that began each pause of `latencies_ms`
    shown_completion_tokens: int = 0
    shown_edits: set[int] = field(default_factory=set)
    predicted_chars: int = 0  # at each pause, how much of what the person typed next its suggestion had
    kept_chars: int = 0  # over every shown suggestion, what the person typed on through (inferred acceptance)

    @property
    def pause_coverage(self) -> float | None:
        return self.covered / self.pauses if self.pauses else None

    def latency(self, q: float) -> float | None:
        return percentile(self.latencies_ms, q)


def account(
    marks: list[EditMark],
    results: list[RequestResult],
    pause_ms: float,
    truth: dict[int, str] | None = None,
    last_look_ms: float = math.inf,
) -> Accounting:
    """Shown completions, pauses, coverage and pause-to-suggestion latency (a pure function).

    A completion is shown if it arrives before the next edit of its file; after a file's last edit, within
    `last_look_ms` (the replays pass their longest kept gap: a person who stopped typing for good does not
    wait a minute for a suggestion, and the two replays' drains differ in how long they wait for one).

    `truth`: what the person typed next after each edit. With it, `predicted_chars` counts, at each pause, the
    characters of it that the suggestion shown there began with: what the person could have accepted when they
    stopped to look, each pause once (the suggestions shown while they typed on predict the same characters
    again, and are not counted twice); and `kept_chars` the same for every shown suggestion, which is what the
    proxy's inferred acceptance sees of a person who types a suggestion out instead of accepting it.
    """
    next_same_file: dict[int, float] = {}
    last_seen: dict[str, int] = {}
    for mark in marks:
        if mark.file in last_seen:
            next_same_file[last_seen[mark.file]] = mark.t_ms
        last_seen[mark.file] = mark.index
    by_edit = {r.edit: r for r in results}
    shown: dict[int, RequestResult] = {}
    sent_at = {m.index: m.t_ms for m in marks}
    for result in results:
        deadline = next_same_file.get(result.edit, sent_at.get(result.edit, 0.0) + last_look_ms)
        if not result.cancelled and result.done_ms is not None and result.text and result.done_ms < deadline:
            shown[result.edit] = result
    acct = Accounting(edits=len(marks), requests=len(results), shown=len(shown), pauses=0, covered=0)
    acct.shown_completion_tokens = sum(r.completion_tokens for r in shown.values())
    acct.shown_edits = set(shown)
    kept = {edit: common_prefix(r.text, truth.get(edit, "")) for edit, r in shown.items()} if truth else {}
    acct.kept_chars = sum(kept.values())
    time_of = {m.index: m.t_ms for m in marks}
    for position, mark in enumerate(marks):
        following = marks[position + 1].t_ms if position + 1 < len(marks) else mark.t_ms + last_look_ms
        if following - mark.t_ms < pause_ms:
            continue
        acct.pauses += 1
        if mark.index in shown and mark.index in by_edit:
            acct.covered += 1
            acct.predicted_chars += kept.get(mark.index, 0)
            done = shown[mark.index].done_ms
            assert done is not None
            acct.latencies_ms.append(done - time_of[mark.index])
            acct.covered_pauses.append(mark.index)
    return acct


def no_prediction_floor(gaps_ms: Sequence[float], allowance_ms: float) -> int:
    """An estimate of the fewest upstream requests of any policy that cannot predict the typing (a model that
    never predicts it, so nothing is answered from an earlier completion) and may start a pause's request at
    most `allowance_ms` after the moment typing stopped: when an edit is `allowance_ms` old it cannot know
    whether the gap after it is a pause, so it must have sent a request for every edit followed by a longer gap.
    An estimate, not a proof, for the targets: it counts every pause (p95 lets 5 % be late) and takes the
    allowance from the oracle's p95 as if the server answered no request faster than the oracle's."""
    return sum(gap > allowance_ms for gap in gaps_ms)


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def window(
    text: str, cursor: int, prefix_lines: int = PREFIX_LINES, suffix_lines: int = SUFFIX_LINES
) -> tuple[str, str]:
    """What a plugin sends around the cursor: the last `prefix_lines` lines before, `suffix_lines` after."""
    prefix = "".join(text[:cursor].splitlines(keepends=True)[-prefix_lines:])
    suffix = "".join(text[cursor:].splitlines(keepends=True)[:suffix_lines])
    return prefix, suffix


async def _read_stream(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """A streamed completion's events gathered into the shape of a plain answer (`choices[0].text`, `usage`)."""
    text, usage = [], None
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = orjson.loads(line[5:])
        text += [choice.get("text") or "" for choice in event.get("choices") or []][:1]
        usage = event.get("usage") or usage
    return {"choices": [{"text": "".join(text)}], "usage": usage}


def _since(start: float) -> Callable[[], float]:
    return lambda: (time.monotonic() - start) * 1000


@dataclass
class Plugin:
    """One simulated editor: sends `/v1/completions` with a Mellum FIM prompt rendered client-side."""

    session: aiohttp.ClientSession
    url: str
    cancels: bool = True
    debounce_ms: float = 0
    max_tokens: int = 64
    prefix_lines: int = PREFIX_LINES
    suffix_lines: int = SUFFIX_LINES
    timeout_s: float = 10.0
    stream: bool = False  # the oracle streams, so that a cancel stops the server (a plain request runs to its end)
    now_ms: Callable[[], float] = field(default_factory=lambda: _since(time.monotonic()))  # the replay's clock
    results: list[RequestResult] = field(default_factory=list)
    _open: asyncio.Task[None] | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def body(self, text: str, cursor: int, file: str) -> dict[str, Any]:
        prefix, suffix = window(text, cursor, self.prefix_lines, self.suffix_lines)
        prompt = MELLUM.render(FimParts(prefix, suffix, file))
        return {"model": "mellum", "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "stream": self.stream, "stop": list(MELLUM.stops)}  # fmt: skip

    def typed_on(self) -> None:
        """An edit it sends nothing for: the open request, if any, will not be shown (cancelled if it cancels)."""
        if self.cancels and self._open is not None and not self._open.done():
            self._open.cancel()

    def on_edit(self, index: int, file: str, text: str, cursor: int) -> None:
        """The user just edited: request a completion (after the plugin's own debounce)."""
        self.typed_on()
        task = asyncio.create_task(self._request(index, file, self.body(text, cursor, file)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._open = task

    @property
    def in_flight(self) -> int:
        return sum(not t.done() for t in self._tasks)

    async def _request(self, index: int, file: str, body: dict[str, Any]) -> None:
        if self.debounce_ms:
            await asyncio.sleep(self.debounce_ms / 1000)  # the plugin's own debounce timer
        result = RequestResult(index, file, self.now_ms())
        self.results.append(result)
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            headers = {"X-Session-Id": "bench-editor"}
            async with self.session.post(self.url, json=body, headers=headers, timeout=timeout) as resp:
                result.status = resp.status
                result.outcome = resp.headers.get("X-Mellum-Outcome")
                if body["stream"] and resp.status == 200:
                    data = await _read_stream(resp)
                else:
                    data = await resp.json(content_type=None)
            result.done_ms = self.now_ms()
            if resp.status == 200:
                result.text = data["choices"][0]["text"]
                result.completion_tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
            else:
                result.error = str(data.get("error"))[:200] if isinstance(data, dict) else str(resp.status)
        except asyncio.CancelledError:
            result.cancelled = True
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.error = type(exc).__name__
        except (ValueError, LookupError, TypeError, AttributeError):  # an answer that is no completion (a web
            result.error = "not a completion answer"  # server's page): the request's failure, not a crash

    async def drain(self, timeout_s: float = 15.0) -> None:
        """Wait for the requests still open (cancelling what is left after `timeout_s`)."""
        pending = list(self._tasks)
        if pending:
            _, left = await asyncio.wait(pending, timeout=timeout_s)
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
