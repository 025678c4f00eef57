"""Shared fixtures: the real embedded llama.cpp server (started once), proxy clients, a clean env."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from mellum_proxy.budget.local import load_local
from mellum_proxy.config import Settings
from mellum_proxy.http import GPU_OPENER, build_app
from mellum_proxy.tuning.workloads.corpus import CODE_DIR, code_texts, train_bpe
from mellum_proxy.upstream.embedded import EmbeddedServer, packaged_model

# Kept between runs (git ignores it): building the packaged GGUF's tokenizer takes ~10 s the first time.
CACHE = Path(__file__).resolve().parent.parent / ".pytest_cache" / "mellum-proxy-cache"
ProxyFactory = Callable[..., Awaitable[TestClient[Any, web.Application]]]


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No MELLUM_PROXY_* variable and no user config file leaks into a test."""
    for key in list(os.environ):
        if key.startswith("MELLUM_PROXY_"):
            monkeypatch.delenv(key)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))  # the default request log goes there
    monkeypatch.setenv("XDG_CACHE_HOME", str(CACHE))  # the GGUF tokenizer is built once, not in every test


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the real server is marked `embedded`, however it reaches the fixture: `make test-fast`
    leaves them out."""
    for item in items:
        if "embedded_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.embedded)


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[EmbeddedServer]:
    """gemma-3-270m in llama.cpp, 2 slots of 2048 tokens: the real upstream of the suite."""
    server = EmbeddedServer(ctx_tokens=4096, slots=2)
    server.start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(CACHE))
        load_local(packaged_model())  # the model's own tokenizer, built before any proxy looks for it
    yield server
    server.stop()


@pytest.fixture
def make_proxy(aiohttp_client: Any) -> ProxyFactory:
    """Start a proxy app on a loopback port with the given settings; closed after the test."""

    async def factory(gpu_opener: Any = None, **settings: Any) -> TestClient[Any, web.Application]:
        app = build_app(Settings(**settings))
        if gpu_opener is not None:
            app[GPU_OPENER] = gpu_opener
        client: TestClient[Any, web.Application] = await aiohttp_client(app)
        return client

    return factory


@pytest.fixture
async def embedded_proxy(make_proxy: ProxyFactory, embedded_server: EmbeddedServer) -> TestClient[Any, Any]:
    """A transparent proxy in front of the embedded server: no debounce, deadline or budget to speak of."""
    return await make_proxy(
        upstream=embedded_server.url, debounce_ms=0, timeout_ms=0, max_context_tokens=1 << 20, max_tokens=1 << 12
    )


@pytest.fixture
def fake_upstream(aiohttp_server: Any) -> Callable[..., Awaitable[tuple[Any, str]]]:
    """Start a `bench.fake_upstream.FakeUpstream` on a loopback port: returns (fake, base_url)."""
    from benchmarks.doubles.fake_upstream import FakeUpstream

    async def factory(**options: Any) -> tuple[FakeUpstream, str]:
        fake = FakeUpstream(**options)
        server = await aiohttp_server(fake.app())
        return fake, str(server.make_url("")).rstrip("/")

    return factory


CORPUS = CODE_DIR


def corpus_texts() -> list[str]:
    return code_texts()


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real byte-level BPE `tokenizer.json`, trained offline on the code corpus."""
    return train_bpe(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
