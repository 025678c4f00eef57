"""Post-processing through HTTP: the client gets the clean part only, in every dialect, streamed and not, and
the upstream's answer is closed before its last event, so the server stops decoding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mellum_proxy.http import RECORDS
from tests.conftest import ProxyFactory
from tests.sse import dialect_text

PREFIX = "def area(w, h):\n    "
SUFFIX = "\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
WRITTEN = {
    # the model's tokens (30 more than any rule needs, so a stream that ran to its end is told apart)
    "suffix_repeat": ["return", " w", " *", " h", "\n", "\n", "\n", "def", " perimeter", "(w,", " h):", "\n"]
    + ["    pass\n"] * 30,
    "repeated_line": ["return w * h\n"] + ["    total += 1\n"] * 30,
    "fim_marker": ["return", " w", " *", " h", "<fim_", "suffix>", "\n"] + ["junk\n"] * 30,
}
SHOWN = {"suffix_repeat": "return w * h", "repeated_line": "return w * h\n    total += 1", "fim_marker": "return w * h"}
BODIES: dict[str, tuple[str, Callable[[bool], dict[str, Any]]]] = {
    "openai": ("/v1/completions", lambda stream: {"prompt": PREFIX, "suffix": SUFFIX, "stream": stream}),
    "llamacpp": ("/infill", lambda stream: {"input_prefix": PREFIX, "input_suffix": SUFFIX, "stream": stream}),
    "ollama": ("/api/generate", lambda stream: {"model": "m", "prompt": PREFIX, "suffix": SUFFIX, "raw": True,
                                                "stream": stream}),
}  # fmt: skip


@pytest.mark.parametrize("rule", list(WRITTEN))
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("dialect", list(BODIES))
async def test_the_client_gets_the_clean_part_and_the_server_stops(
    make_proxy: ProxyFactory, fake_upstream: Any, dialect: str, stream: bool, rule: str
) -> None:
    fake, url = await fake_upstream(pieces=WRITTEN[rule], token_delay_s=0.002)
    proxy = await make_proxy(upstream=url, tokenizer="chars", debounce_ms=0, timeout_ms=0, max_tokens=64,
                             reuse=False)  # fmt: skip
    path, body = BODIES[dialect]
    resp = await proxy.post(path, json=body(stream))
    assert resp.status == 200
    assert await dialect_text(resp, dialect, stream) == SHOWN[rule]
    await fake.wait_until(lambda f: f.disconnects == 1)  # closed before its last event
    assert fake.completed == 0 and fake.sent_tokens < len(WRITTEN[rule])
    record = proxy.app[RECORDS].last()
    assert (record.outcome, record.cleaned) == ("ok", rule)


async def test_off_the_model_text_reaches_the_client_as_written(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    pieces = WRITTEN["fim_marker"][:8]
    fake, url = await fake_upstream(pieces=pieces)
    proxy = await make_proxy(upstream=url, tokenizer="chars", debounce_ms=0, postprocess=False)
    resp = await proxy.post("/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 64})
    assert (await resp.json())["choices"][0]["text"] == "".join(pieces)
    assert proxy.app[RECORDS].last().cleaned is None and fake.completed == 1


async def test_a_reused_remainder_is_cleaned_the_same_way(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    fake, url = await fake_upstream(pieces=["return", " w", " *", " h", "<fim_suffix>", "junk"])
    proxy = await make_proxy(upstream=url, tokenizer="chars", debounce_ms=0, timeout_ms=0)
    first = await proxy.post("/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 16})
    assert (await first.json())["choices"][0]["text"] == "return w * h"
    typed = {"prompt": PREFIX + "return w", "suffix": SUFFIX, "max_tokens": 16}
    second = await proxy.post("/v1/completions", json=typed)  # the person typed on into it
    assert (await second.json())["choices"][0]["text"] == " * h"
    assert [(r.outcome, r.cleaned) for r in proxy.app[RECORDS]] == [("ok", "fim_marker"), ("reused", "fim_marker")]
    assert len(fake.payloads) == 1
