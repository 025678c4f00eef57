"""Typed-through reuse over HTTP: the outcome header, the request log and /metrics say `reused`."""

from __future__ import annotations

from typing import Any

import orjson

from tests.conftest import ProxyFactory


async def test_typing_through_is_answered_without_the_upstream(make_proxy: ProxyFactory, fake_upstream: Any,
                                                               tmp_path: Any) -> None:  # fmt: skip
    fake, url = await fake_upstream(tokens=4)  # writes "t0 t1 t2 t3 "
    log = tmp_path / "requests.jsonl"
    proxy = await make_proxy(upstream=url, tokenizer="chars", log=log)
    body = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 8}
    first = await proxy.post("/infill", json=body)
    assert first.headers["X-Mellum-Outcome"] == "ok"
    assert (await first.json())["content"] == "t0 t1 t2 t3 "
    second = await proxy.post("/infill", json=body | {"input_prefix": "x = t0 t"})
    assert second.headers["X-Mellum-Outcome"] == "reused"
    assert (await second.json())["content"] == "1 t2 t3 "  # exactly the rest
    assert len(fake.payloads) == 1
    metrics = await (await proxy.get("/metrics")).text()
    assert 'mellum_proxy_requests_total{outcome="reused"} 1.0' in metrics
    await proxy.close()  # shutdown flushes the log
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert [line["outcome"] for line in lines] == ["ok", "reused"]
    assert lines[1]["reached_upstream"] is False
