"""The lab's parts around the proxy's real service: what the simulated model writes (`Writer`), the service's
upstream over the simulated server (`EngineSource`), and the simulated plugin (`LabEditor`). Shared by the lab
(`mellum_proxy.tuning.runners.lab`) and its developers-per-server runs (`mellum_proxy.tuning.runners.capacity`).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from mellum_proxy.budget.templates import MELLUM, FimParts
from mellum_proxy.errors import ProxyError, UpstreamStatusError
from mellum_proxy.models import Batches, BudgetedPrompt, Chunk, Completion, NormalizedRequest, Outcome
from mellum_proxy.serving import CompletionService
from mellum_proxy.tuning.runners.playback import Clock
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.sim.engine import SimEngine, SimRefused
from mellum_proxy.tuning.workloads.editor import RequestResult, window

JUNK = "\u00a4" * 1024


class Writer:
    """What the simulated model writes for a request: the person's next line with probability `accuracy`."""

    def __init__(self, truth: dict[int, str], accuracy: float, seed: int = 0) -> None:
        self.truth = truth
        self.accuracy = accuracy
        self.seed = seed

    def text(self, edit: int, prompt: str) -> str:
        typed = self.truth.get(edit, "")
        draw = int(hashlib.sha256(f"{self.seed}:{edit}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if typed and draw < self.accuracy:
            line, newline, _ = typed.partition("\n")
            return line + newline if line or newline else typed
        return JUNK  # never what anyone types; as long as asked: the real model seldom stops early


class EngineSource:
    """The proxy's `CompletionSource` over the simulated server, with its exact `let_go`."""

    def __init__(self, engine: SimEngine, writer: Writer, edit_of: dict[str, int]) -> None:
        self.engine = engine
        self.writer = writer
        self.edit_of = edit_of  # request id -> edit index
        self.tasks: dict[str, Any] = {}

    async def stream_completion(self, request: NormalizedRequest, prompt: BudgetedPrompt) -> Batches:
        text = prompt.prompt + (prompt.suffix or "")
        try:
            task = self.engine.submit(text, prompt.max_tokens, self.writer.text(self.edit_of[request.id], text))
        except SimRefused as exc:  # llama.cpp's answer: the proxy fits the prompt again, harder, once
            raise UpstreamStatusError(400, str(exc), "exceed_context_size_error") from exc
        self.tasks[request.id] = task
        try:
            first = True
            async for pieces in task.stream():
                chunks = [Chunk(piece) for piece in pieces]
                if first:
                    chunks[0].upstream_id, first = f"lab-{request.id}", False
                yield chunks
            usage = {"prompt_tokens": task.prompt_tokens, "completion_tokens": task.completion_tokens}
            yield [Chunk("", finish_reason=task.finish_reason, usage=usage, upstream_id=f"lab-{request.id}")]
        finally:
            if not task.done:
                task.leave()

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        engine = self.engine
        try:
            await engine.changes.wait_for(lambda: accept(engine.held), timeout_s)
        except TimeoutError:
            return False
        return True


class CollectingAnswer:
    def __init__(self) -> None:
        self.text = ""
        self.outcome: Outcome | None = None
        self.source: str | None = None
        self.error: str | None = None

    async def send(self, completion: Completion, chunks: Sequence[Chunk]) -> None:
        return None

    async def finish(self, completion: Completion, outcome: Outcome) -> None:
        self.text, self.outcome, self.source = completion.text, outcome, completion.upstream_id

    async def fail(self, completion: Completion, error: ProxyError) -> None:
        self.error = str(error)


class LabEditor:
    """The simulated plugin in the lab: one request per edit, the previous one cancelled (if it cancels);
    `direct` sends the Mellum prompt to the engine itself, a policy hands the request to the service."""

    def __init__(self, policy: Policy, engine: SimEngine, source: EngineSource, service: CompletionService | None,
                 clock: Clock, max_tokens: int) -> None:  # fmt: skip
        self.policy, self.engine, self.source, self.service = policy, engine, source, service
        self.clock, self.max_tokens = clock, max_tokens
        self.results: list[RequestResult] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._open: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return sum(not task.done() for task in self.tasks)

    def typed_on(self) -> None:
        if self.policy.plugin_cancel and self._open is not None and not self._open.done():
            self._open.cancel()

    def on_edit(self, index: int, file: str, text: str, cursor: int) -> None:
        self.typed_on()
        prefix, suffix = window(text, cursor)
        result = RequestResult(index, file, self.clock.now_ms())
        self.results.append(result)
        if self.service is None:
            coro = self._direct(result, MELLUM.render(FimParts(prefix, suffix, file)))
        else:
            request = NormalizedRequest(id=str(index), route="lab", session="lab", prefix=prefix, suffix=suffix,
                                        max_tokens=self.max_tokens, file_path=file,
                                        params={"temperature": 0})  # fmt: skip
            self.source.edit_of[request.id] = index
            coro = self._proxied(result, request)
        self._open = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(self._open)
        self._open.add_done_callback(self.tasks.discard)

    async def _direct(self, result: RequestResult, prompt: str) -> None:
        writer = self.source.writer
        try:  # as the plugin sends it: not streamed; the oracle streams, so that its cancel stops the server
            task = self.engine.submit(prompt, self.max_tokens, writer.text(result.edit, prompt),
                                      stream=self.policy.oracle)  # fmt: skip
        except SimRefused as exc:
            result.error = str(exc)
            return
        self.source.tasks[str(result.edit)] = task
        try:
            await task.changes.wait_for(lambda: task.done, timeout_s=math.inf)
        except asyncio.CancelledError:
            task.leave()
            result.cancelled = True
            raise
        result.done_ms, result.text = self.clock.now_ms(), "".join(task.pieces)
        result.completion_tokens, result.outcome = task.completion_tokens, f"lab-{result.edit}"

    async def _proxied(self, result: RequestResult, request: NormalizedRequest) -> None:
        assert self.service is not None
        answer = CollectingAnswer()
        try:
            await self.service.complete(request, answer)
        except asyncio.CancelledError:
            result.cancelled = True
            raise
        result.done_ms, result.text, result.error = self.clock.now_ms(), answer.text, answer.error
        result.status = 200 if answer.error is None else 502
        result.outcome = answer.source or (answer.outcome.value if answer.outcome else None)
        result.completion_tokens = 0
