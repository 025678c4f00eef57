"""`SimEngine`: a model server as llama.cpp behaves, with no HTTP and no model — the core of both
`mellum_proxy/tuning/sim/server.py` (over HTTP, real time) and the policy lab
(`mellum_proxy/tuning/runners/lab.py`, virtual time).

What it keeps from llama.cpp's server (`tools/server/server.cpp`), because the proxy's policies
depend on it:
- `slots` sequences run at once; other tasks wait in one FIFO queue.
- A streamed task whose client left while it was queued stays queued until a slot takes it, and is
  dropped then (it still counts as held: `requests_deferred`).
- Prefill cannot be interrupted: a client that leaves during prefill frees the slot only after it.
  Decoding of a streamed task stops at the next token once the client has gone.
- A non-streamed task (`stream: false`) is not stopped when its client leaves. Its HTTP handler waits for its
  answer a second at a time (`HTTP_POLLING_SECONDS`), and any result the server sends to any request wakes it and
  starts the second again; only after a second in which no result came does it look at the connection, and if the
  client has gone it cancels the task (queued: dropped; running: stopped at its next token). On a server sending
  results (a stream's every token, another request's end), an abandoned task runs to its end: measured on the
  embedded server, 300 abandoned 16-token requests decoded 4,800 tokens (docs/measurements/runs/calibration).
- Each slot keeps its last prompt (the prompt cache); a task takes the free slot whose cache shares
  the longest prefix with its prompt, and only the rest is prefilled.
- Prefill and decode slow down by `batch_penalty` for each other sequence running.
- A request's time varies from one request to the next as the server's measured `spread` says (a factor drawn
  for each task, log-normal, from a generator seeded at the engine's making, so a lab run repeats exactly),
  and a request that finds nothing running takes `idle_slowdown` times longer: a server a moment idle answers
  slower than a busy one (measured by `mellum-proxy profile`: 1.26-1.48x on this project's 2-core VM).
- Decode time is counted as llama.cpp's `/metrics` counts it (`tokens_predicted_seconds_total`): from each
  task's first token to its last, a task whose client left included.
- The KV cache is split among the slots (`kv_tokens / slots` each, llama.cpp's `n_ctx` per slot): a prompt
  longer than a slot's context is refused at once (llama.cpp's 400 `exceed_context_size_error`); waiting in
  the queue takes none of it, so any number of tasks may wait (llama.cpp queues, it does not refuse).

Time is the event loop's (`loop.time()`), so on a `looptime` loop a whole replay runs in virtual time.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from functools import partial

from mellum_proxy.observe import Changes
from mellum_proxy.tuning.sim.server_profile import ServerProfile


class SimRefused(Exception):
    """The prompt does not fit a slot's context (llama.cpp's 400 `exceed_context_size_error`)."""

    def __init__(self, prompt_tokens: int, slot_tokens: int) -> None:
        super().__init__(
            f"request ({prompt_tokens} tokens) exceeds the available context size ({slot_tokens} "
            "tokens), try increasing it"
        )  # fmt: skip (llama.cpp's words)
        self.prompt_tokens, self.slot_tokens = prompt_tokens, slot_tokens


@dataclass(eq=False, slots=True)
class SimTask:
    prompt: str
    prompt_tokens: int
    max_tokens: int
    text: str  # what the "model" will write, cut to max_tokens
    submitted: float
    streamed: bool = True  # False: the client asked `stream: false`
    pieces: list[str] = field(default_factory=list)
    gone: bool = False  # the client left
    done: bool = False
    started: bool = False
    dropped: bool = False  # left before a slot took it: never ran
    cancelled: bool = False  # its handler saw the client gone (a non-streamed task, after a second without results)
    finish_reason: str | None = None
    cached_tokens: int = 0
    changes: Changes = field(default_factory=Changes)

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    def leave(self) -> None:
        """The client went away (closed its connection)."""
        self.gone = True

    async def stream(self) -> AsyncIterator[list[str]]:
        """The pieces as they are decoded, in batches of what arrived since the last read."""
        sent = 0
        while True:
            if sent < len(self.pieces):
                batch, sent = self.pieces[sent:], len(self.pieces)
                yield batch
                continue
            if self.done:
                return
            await self.changes.wait_for(partial(self._more_than, sent), timeout_s=math.inf)

    def _more_than(self, sent: int) -> bool:
        return self.done or sent < len(self.pieces)


class _Slot:
    __slots__ = ("busy", "cache")

    def __init__(self) -> None:
        self.busy = False
        self.cache = ""


HTTP_POLLING_S = 1.0  # llama.cpp's `HTTP_POLLING_SECONDS`: how long a non-streamed handler waits for results


class SimEngine:
    def __init__(self, spec: ServerProfile, seed: int = 0) -> None:
        self.spec = spec
        self._random = random.Random(seed)
        self._slots = [_Slot() for _ in range(spec.slots)]
        self._queue: list[SimTask] = []
        self._running: set[asyncio.Task[None]] = set()
        self.active = 0
        self.kv_in_use = 0
        self.tokens_predicted = 0
        self.decode_seconds = 0.0  # llama.cpp's `tokens_predicted_seconds_total`: each task's first token to its last
        self.prompt_tokens = 0  # computed (prefilled), not served from cache
        self.prompt_tokens_cached = 0
        self.requests = 0
        self.refused = 0
        self.peak_held = 0
        self.changes = Changes()
        self.results_sent = 0  # every result the server sent: a streamed token, a task's end
        self._results = Changes()

    @property
    def deferred(self) -> int:
        return len(self._queue)

    @property
    def held(self) -> int:
        """Requests the server holds: running plus queued (llama.cpp `requests_processing + requests_deferred`)."""
        return self.active + len(self._queue)

    def tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.spec.chars_per_token)

    def submit(self, prompt: str, max_tokens: int, text: str, stream: bool = True) -> SimTask:
        """Queue a task; it runs on its own, whether or not its client stays."""
        prompt_tokens = self.tokens(prompt)
        slot_tokens = self.spec.kv_tokens // self.spec.slots
        if prompt_tokens >= slot_tokens:
            self.refused += 1
            raise SimRefused(prompt_tokens, slot_tokens)
        self.requests += 1
        loop = asyncio.get_running_loop()
        task = SimTask(prompt, prompt_tokens, max_tokens, text, loop.time(), stream)
        self._queue.append(task)
        self._note()
        self._start(self._run(task))
        if not stream:
            self._start(self._handle(task))
        return task

    def _start(self, work: Coroutine[None, None, None]) -> None:
        runner = asyncio.get_running_loop().create_task(work)
        self._running.add(runner)
        runner.add_done_callback(self._running.discard)

    def _sent(self) -> None:
        self.results_sent += 1
        self._results.notify()

    def _heard(self, task: SimTask, before: int) -> bool:
        return task.done or self.results_sent != before

    def metrics_read(self) -> None:
        """A `/metrics` answer: llama.cpp answers it through its task queue, so like any result it wakes every
        waiting handler (measured: read every 50 ms, an abandoned non-streamed request ran all 300 of its tokens;
        left unread, it stopped after 21)."""
        self._sent()

    async def read_metrics_every(self, period_s: float) -> None:
        """Read `/metrics` every `period_s`, as `bench replay` does beside a real server, until cancelled."""
        while True:
            self.metrics_read()
            await asyncio.sleep(period_s)

    async def _handle(self, task: SimTask) -> None:
        """A non-streamed request's HTTP handler: it waits for the answer a second at a time, each result the
        server sends (to anyone) starting the second again; after a silent second, a client gone cancels it."""
        while not task.done:
            try:
                await self._results.wait_for(partial(self._heard, task, self.results_sent), HTTP_POLLING_S)
            except TimeoutError:
                if task.gone:
                    task.cancelled = True
                    self.changes.notify()  # a queued task leaves the queue now
                    return

    def _note(self) -> None:
        self.peak_held = max(self.peak_held, self.held)
        self.changes.notify()

    def _free_slot(self, prompt: str) -> _Slot | None:
        free = [slot for slot in self._slots if not slot.busy]
        if not free:
            return None
        return max(free, key=lambda slot: _common_prefix(slot.cache, prompt))

    async def _run(self, task: SimTask) -> None:
        size = min(task.prompt_tokens + task.max_tokens, self.spec.kv_tokens // self.spec.slots)
        try:
            await self.changes.wait_for(lambda: task.cancelled or (self._queue[0] is task and
                                        self._free_slot("") is not None), timeout_s=math.inf)  # fmt: skip
            self._queue.remove(task)
            if task.cancelled or (task.gone and task.streamed):  # left while queued: dropped, never run
                task.dropped = True
                return
            slot = self._free_slot(task.prompt)
            assert slot is not None
            slot.busy, task.started = True, True
            woke = self.active == 0  # the server was idle: its next request runs slower
            self.active += 1
            self.kv_in_use += size  # a slot's cells, while it runs
            self._note()
            try:
                await self._generate(task, slot, self.spec.idle_slowdown if woke else 1.0)
            finally:
                slot.busy = False
                self.active -= 1
                self.kv_in_use -= size
        finally:
            task.done = True
            task.changes.notify()
            if not task.dropped and task.finish_reason != "cancelled":
                self._sent()  # its answer's end (a cancelled task's client is sent nothing)
            self._note()

    async def _generate(self, task: SimTask, slot: _Slot, slowdown: float) -> None:
        spec = self.spec
        cached = min(math.floor(_common_prefix(slot.cache, task.prompt) / spec.chars_per_token), task.prompt_tokens)
        computed = task.prompt_tokens - cached
        task.cached_tokens = cached
        factor = slowdown * (self._random.lognormvariate(0.0, spec.spread) if spec.spread > 0 else 1.0)
        overhead_ms = spec.overhead_ms + task.prompt_tokens * spec.overhead_per_token_ms
        await asyncio.sleep(factor * (overhead_ms / 1000 + computed / spec.prefill_tps * self._slowdown()))
        slot.cache = task.prompt
        self.prompt_tokens += computed
        self.prompt_tokens_cached += cached
        pieces = _pieces(task.text, spec.chars_per_token)[: task.max_tokens]
        loop = asyncio.get_running_loop()
        previous: float | None = None  # when its last token came
        for piece in pieces:
            if task.gone and (task.streamed or task.cancelled):
                task.finish_reason = "cancelled"
                return
            await asyncio.sleep(factor * self._slowdown() / spec.decode_tps)  # one decode step
            now = loop.time()
            if previous is not None:  # llama.cpp's counter runs from the first token on
                self.decode_seconds += now - previous
            previous = now
            self.tokens_predicted += 1
            slot.cache += piece
            task.pieces.append(piece)
            task.changes.notify()
            if task.streamed:
                self._sent()
        task.finish_reason = "stop" if len(pieces) < task.max_tokens else "length"

    def _slowdown(self) -> float:
        return 1 + self.spec.batch_penalty * max(0, self.active - 1)

    async def idle(self) -> None:
        """Return once nothing runs or waits."""
        await self.changes.wait_for(lambda: self.held == 0, timeout_s=math.inf)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on the first difference: prompts are long
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _pieces(text: str, chars_per_token: float) -> list[str]:
    """`text` as tokens of about `chars_per_token` characters (whitespace starts a new one)."""
    size = max(1, round(chars_per_token))
    return [text[i : i + size] for i in range(0, len(text), size)]
