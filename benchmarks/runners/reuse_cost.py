"""`python -m benchmarks.runners.reuse_cost`: what typed-through reuse keeps, and how long a lookup holds the
loop, with the largest prompts a client may send (4 MB, in text outside Latin-1: 4 bytes a character in memory).

256 sessions x 4 entries are remembered, each request's prompt a new 4 MB string that is dropped after the
call, as requests come and go; the process's resident memory is read before and after. Then the lookup of a
4 MB prompt that types through the newest entry is timed (the loop is blocked that long).
"""

from __future__ import annotations

import os
import time

from benchmarks.runners.processes import rss_mib
from mellum_proxy.models import BudgetedPrompt, Chunk, Completion, NormalizedRequest
from mellum_proxy.serving.flight import Flight
from mellum_proxy.serving.reuse import ENTRIES_PER_SESSION, MAX_SESSIONS, ReuseCache

LINE = "значение = вычислить(1)  # 😀\n"  # outside Latin-1, and outside the BMP: 4 bytes a character


def _done(text: str) -> Flight:
    completion = Completion(id="c")
    completion.add(Chunk(text, finish_reason="stop"))
    flight = Flight(completion, BudgetedPrompt("p", None, 16, (), 1, 1, False, "chars"))
    flight.ended_on_its_own = True
    flight.end()
    return flight


def measure(prompt_mb: float = 4.0) -> dict[str, float]:
    body = LINE * int(prompt_mb * 1e6 / len(LINE.encode()))
    cache = ReuseCache()
    before = rss_mib(os.getpid())
    for session in range(MAX_SESSIONS):
        for entry in range(ENTRIES_PER_SESSION):
            prefix = body + f"# {session}/{entry}\nx = "  # a new 4 MB string each time
            request = NormalizedRequest(id="r", route="openai", session=str(session), prefix=prefix, suffix=body)
            cache.remember(request, _done("compute(1)"))
    del prefix, request
    after = rss_mib(os.getpid())
    typed = NormalizedRequest(id="r", route="openai", session="255", prefix=body + "# 255/3\nx = comp", suffix=body)
    started = time.perf_counter()
    hit = cache.lookup(typed)
    lookup_ms = (time.perf_counter() - started) * 1000
    assert hit is not None and hit.typed == "comp"
    return {"prompt_mb": prompt_mb, "entries": MAX_SESSIONS * ENTRIES_PER_SESSION, "rss_before_mib": before,
            "rss_after_mib": after, "kept_mib": after - before, "lookup_ms": lookup_ms}  # fmt: skip


if __name__ == "__main__":
    result = measure()
    print(f"{result['entries']} entries of {result['prompt_mb']:.0f} MB prompts: RSS {result['rss_before_mib']:.1f} "
          f"-> {result['rss_after_mib']:.1f} MiB ({result['kept_mib']:+.1f}); a 4 MB prompt's lookup "
          f"{result['lookup_ms']:.2f} ms")  # fmt: skip
