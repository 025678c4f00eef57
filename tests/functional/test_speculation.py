"""The embedded llama.cpp's self-speculation through the proxy: the server drafts from the text, and each record
carries what it drafted and what the model accepted, from the server's own timings; `/metrics` sums them."""

from __future__ import annotations

import logging

import pytest

from mellum_proxy.http import RECORDS
from tests.conftest import ProxyFactory

pytestmark = pytest.mark.embedded

REPETITIVE = "def f(a):\n    return a + 1\n\n" * 12 + "def f(a):\n    return"


async def test_a_speculating_server_says_what_it_drafted_and_the_record_keeps_it(
    make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mellum_proxy")
    proxy = await make_proxy(embedded=True, embedded_spec="ngram-mod", embedded_cache_reuse=256,
                             embedded_ctx_tokens=2048, embedded_slots=1, timeout_ms=0, reuse=False)  # fmt: skip
    for stream in (True, False):
        body = {"prompt": REPETITIVE, "max_tokens": 24, "temperature": 0, "stream": stream}
        resp = await proxy.post("/v1/completions", json=body)
        assert resp.status == 200
        await resp.read()
        record = proxy.app[RECORDS].last()
        assert record.draft_n is not None and record.draft_n > 0, record  # the server drafted from the text
        assert record.draft_n_accepted is not None and 0 <= record.draft_n_accepted <= record.draft_n
    metrics = (await (await proxy.get("/metrics")).read()).decode()
    drafted = next(line for line in metrics.splitlines() if line.startswith("mellum_proxy_draft_tokens_total "))
    assert float(drafted.split()[1]) > 0
    status = await (await proxy.get("/status")).json()
    assert status["settings"]["embedded_spec"] == "ngram-mod" and status["settings"]["embedded_cache_reuse"] == 256
    said = status["speculation"]  # the live page shows it among its counts
    assert said["drafted"] > 0 and 0 <= said["acceptance"] <= 1
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready in")]
    assert ready and "speculation ngram-mod, cache reuse 256" in ready[0]


async def test_without_speculation_a_record_says_nothing_drafted(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(embedded=True, embedded_ctx_tokens=2048, embedded_slots=1, timeout_ms=0, reuse=False)
    resp = await proxy.post("/v1/completions", json={"prompt": REPETITIVE, "max_tokens": 8, "temperature": 0})
    assert resp.status == 200
    record = proxy.app[RECORDS].last()
    assert record.draft_n is None and record.draft_n_accepted is None


async def test_a_draft_model_drafts_for_the_served_one(make_proxy: ProxyFactory) -> None:
    """`embedded_spec = "draft:FILE"`: a second GGUF of the same vocabulary drafts (here the packaged model for
    itself, so nearly every draft is accepted); the records carry what the server's timings say."""
    from mellum_proxy.upstream.embedded import packaged_model

    proxy = await make_proxy(embedded=True, embedded_spec=f"draft:{packaged_model()}", embedded_ctx_tokens=1024,
                             embedded_slots=1, timeout_ms=0, reuse=False)  # fmt: skip
    resp = await proxy.post("/v1/completions", json={"prompt": REPETITIVE, "max_tokens": 24, "temperature": 0})
    assert resp.status == 200
    record = proxy.app[RECORDS].last()
    assert record.draft_n and record.draft_n_accepted is not None and record.draft_n_accepted > record.draft_n / 2


def test_a_model_without_a_multi_token_head_does_not_start_with_draft_mtp() -> None:
    from mellum_proxy.upstream.embedded import EmbeddedServer

    server = EmbeddedServer(ctx_tokens=256, slots=1, spec="draft-mtp")
    with pytest.raises(RuntimeError):  # llama.cpp: "failed to create MTP context"
        server.start()
    server.stop()
