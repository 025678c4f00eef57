"""Fuzzing every POST endpoint and the headers the proxy reads: never a 500, always an answer within
the deadline, and the proxy still serving afterwards.

Bodies are JSON objects built from the fields the dialects know (and some they do not), with values
of every JSON type, or bytes that are not JSON at all. The run is derandomized, so CI sees the same
5,000 cases every time.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.doubles.fake_upstream import FakeUpstream
from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS, build_app
from mellum_proxy.http.server import serve_app

pytestmark = pytest.mark.slow  # seconds of real time: in `make test`, not in `make test-fast`

PATHS = ["/v1/completions", "/infill", "/completion", "/api/generate", "/v1/chat/completions", "/api/show",
         "/v1/embeddings"]  # fmt: skip
FIELDS = ["prompt", "suffix", "input_prefix", "input_suffix", "input_extra", "stream", "max_tokens", "n_predict",
          "temperature", "top_p", "top_k", "seed", "stop", "n", "options", "stream_options", "response_fields",
          "id_slot", "model", "messages", "user", "samplers", "t_max_predict_ms", "cache_prompt", "raw",
          "num_ctx", "num_predict", "filename", "text", "logit_bias", "echo", "name"]  # fmt: skip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40), st.sampled_from(["", "def f(", "<fim_suffix><fim_prefix><fim_middle>", "\u0000", "🦀"]),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
objects = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)
bodies = st.one_of(
    objects.map(lambda body: json.dumps(body).encode()),  # the standard library writes ints past 64 bits
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b'"x"',
            b"{",
            b'{"prompt": "\\ud800"}',
            b'{"prompt": NaN}',
            b'{"prompt": 1e999}',
            b"[" * 2000 + b"]" * 2000,
        ]
    ),
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=30)
headers = st.fixed_dictionaries(
    {},
    optional={
        "X-Session-Id": header_text, "X-File-Path": header_text, "X-Language": header_text,
        "Content-Type": st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
    },
)  # fmt: skip

DEADLINE_S = 5.0  # far above the proxy's own (timeout_ms=1000): no request may hang


def test_fuzz_every_post_endpoint() -> None:
    """Hypothesis drives plain functions, so the proxy runs on a loop of this test's own."""
    loop = asyncio.new_event_loop()
    stack = AsyncExitStack()
    try:
        app, url, session = loop.run_until_complete(start(stack))
        statuses: dict[int, int] = {}

        async def one(path: str, body: bytes, header: dict[str, str]) -> None:
            async with asyncio.timeout(DEADLINE_S), session.post(url + path, data=body, headers=header) as resp:
                answer = await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            assert resp.status < 500 or resp.status in (502, 503, 504), (path, body[:200], resp.status, answer[:300])
            if resp.status >= 400:
                assert "error" in orjson.loads(answer), answer[:300]

        @settings(max_examples=5000, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
        @given(path=st.sampled_from(PATHS), body=bodies, header=headers)
        def case(path: str, body: bytes, header: dict[str, str]) -> None:
            loop.run_until_complete(one(path, body, header))

        case()
        print("fuzz: answers by status", dict(sorted(statuses.items())))  # shown with pytest -s
        assert sum(statuses.values()) >= 5000 and 500 not in statuses
        assert statuses.get(200, 0) > 100 and statuses.get(400, 0) > 100  # both kinds were exercised
        loop.run_until_complete(still_serving(app, url, session))
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


async def start(stack: AsyncExitStack) -> tuple[web.Application, str, aiohttp.ClientSession]:
    fake = FakeUpstream(tokens=2)
    upstream = await stack.enter_async_context(serve_app(fake.app()))
    settings = Settings(upstream=upstream, tokenizer="chars", timeout_ms=1000, hold_min_ms=0, max_concurrency=2)
    app = build_app(settings)
    url = await stack.enter_async_context(serve_app(app))
    session = await stack.enter_async_context(aiohttp.ClientSession())
    return app, url, session


async def still_serving(app: web.Application, url: str, session: aiohttp.ClientSession) -> None:
    async with session.post(url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "t0 t1 "
    assert app[RECORDS].last().outcome == "ok"
    async with session.get(url + "/status") as status:
        assert status.status == 200 and (await status.json())["inflight"] == 0
