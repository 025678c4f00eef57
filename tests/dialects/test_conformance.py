"""Every plugin's own answer-reading code (`tests.dialects.plugins`) against every answer the proxy gives it:
a real completion from the embedded llama.cpp server, a completion cut by the deadline, one that never
started, a typed-through reuse, and an upstream failure. Each plugin sends its own request body
(`tests/fixtures/clients/`, captured or built from its source)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mellum_proxy.http import PROBES, RECORDS
from mellum_proxy.upstream.embedded import EmbeddedServer
from tests.conftest import ProxyFactory
from tests.dialects.plugins import PLUGINS, Plugin, continue_show, request_body

IDS = [plugin.name for plugin in PLUGINS]


async def ask(proxy: Any, plugin: Plugin, body: dict[str, Any] | None = None) -> tuple[int, bytes, str]:
    resp = await proxy.post(plugin.path, json=body or request_body(plugin), headers=dict(plugin.headers))
    return resp.status, await resp.read(), resp.headers.get("X-Mellum-Outcome", "")


def typed_through(plugin: Plugin, typed: str) -> dict[str, Any]:
    """The plugin's next request after the person typed `typed` at the cursor."""
    body = request_body(plugin)
    if "cursor_position" in body:  # Sweep's: the file and a byte offset into it
        at = body["cursor_position"]
        data = body["file_contents"].encode()
        body["file_contents"] = (data[:at] + typed.encode() + data[at:]).decode()
        body["cursor_position"] = at + len(typed.encode())
    elif plugin.name.startswith("Zed"):  # each of Zed's formats places the prefix elsewhere: at the demo's cursor
        body["prompt"] = body["prompt"].replace("    total = ", "    total = " + typed, 1)
    elif "input_prefix" in body or "suffix" in body:
        body["prompt"] += typed
    else:  # a prompt the plugin rendered itself, prefix first (`<fim_prefix>...<fim_suffix>...`)
        body["prompt"] = body["prompt"].replace("<fim_suffix>", typed + "<fim_suffix>", 1)
    return body


@pytest.mark.parametrize("plugin", PLUGINS, ids=IDS)
async def test_a_real_completion_reads_cleanly(
    plugin: Plugin, make_proxy: ProxyFactory, embedded_server: EmbeddedServer
) -> None:
    proxy = await make_proxy(upstream=embedded_server.url, timeout_ms=0, max_tokens=16)
    await asyncio.wait_for(proxy.app[PROBES].settled.wait(), 60)
    status, raw, outcome = await ask(proxy, plugin)
    assert status == 200 and outcome in ("ok", ""), raw[:300]  # a stream sends its header before the outcome
    shown = plugin.read(status, raw)
    assert "<fim_" not in shown and "<filename>" not in shown  # no FIM marker reaches a plugin
    assert proxy.app[RECORDS].last().outcome == "ok"


LINES = ["    total = sum(u.age", " for u in users)", "\n", "    return total", "\n\n", "\nif ", "users"]


@pytest.mark.parametrize("plugin", PLUGINS, ids=IDS)
async def test_a_completion_cut_by_the_deadline_ends_at_a_complete_line(
    plugin: Plugin, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """The model is in the middle of its fourth line (`if `) when the deadline comes."""
    _fake, url = await fake_upstream(pieces=LINES, stall_after=6)
    # postprocess off: its scope rule would end this completion at `return`, before the deadline does
    proxy = await make_proxy(upstream=url, timeout_ms=400, tokenizer="chars", reuse=False, postprocess=False)
    status, raw, outcome = await ask(proxy, plugin)
    assert status == 200 and outcome in ("timeout", "")  # a stream's outcome comes in its last event
    assert plugin.read(status, raw) == "    total = sum(u.age for u in users)\n    return total"
    assert proxy.app[RECORDS].last().outcome == "timeout"
    assert b'"stop"' not in raw.replace(b'"stop":true', b"").replace(b'"stop":false', b"")  # never finish: stop


@pytest.mark.parametrize("plugin", PLUGINS, ids=IDS)
async def test_an_answer_without_any_token_reads_as_no_suggestion(
    plugin: Plugin, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    _fake, url = await fake_upstream(stall_after=0)
    proxy = await make_proxy(upstream=url, timeout_ms=300, tokenizer="chars")
    status, raw, _ = await ask(proxy, plugin)
    assert status == 200
    assert plugin.read(status, raw) == ""


@pytest.mark.parametrize("plugin", PLUGINS, ids=IDS)
async def test_a_typed_through_completion_is_reused_in_the_plugins_shape(
    plugin: Plugin, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream(pieces=[" sum(u.age", " for u in users)", "\n", "    return total"])
    # postprocess off: its scope rule would end the completion with the statement (tests/functional/test_cleanup.py)
    proxy = await make_proxy(upstream=url, timeout_ms=0, tokenizer="chars", postprocess=False)
    status, raw, _ = await ask(proxy, plugin)
    assert plugin.read(status, raw) == " sum(u.age for u in users)\n    return total"
    status, raw, _ = await ask(proxy, plugin, typed_through(plugin, " sum(u.a"))
    assert plugin.read(status, raw) == "ge for u in users)\n    return total"
    assert proxy.app[RECORDS].last().outcome == "reused" and len(fake.payloads) == 1


@pytest.mark.parametrize("plugin", PLUGINS, ids=IDS)
async def test_an_upstream_failure_is_an_error_the_plugin_can_read(
    plugin: Plugin, make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    fake, url = await fake_upstream()
    fake.fail_status = 500
    proxy = await make_proxy(upstream=url, timeout_ms=0, tokenizer="chars")
    status, raw, _ = await ask(proxy, plugin)
    assert status == 502
    if plugin.name.startswith("Continue"):
        with pytest.raises(AssertionError, match="streamResponse throws"):
            plugin.read(status, raw)  # Continue shows the error text, as it does for the real server's
    elif plugin.name == "Twinny":
        with pytest.raises(AssertionError, match="status code: 502"):
            plugin.read(status, raw)
    else:
        assert plugin.read(status, raw) == ""


async def test_continues_ollama_provider_reads_one_context_the_budget_uses(
    make_proxy: ProxyFactory, fake_upstream: Any
) -> None:
    """Continue sizes its prompts by `/api/show`'s `num_ctx`: it must be the context the budget fits to,
    lowered to the server's, not the setting."""
    _fake, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars", max_context_tokens=4096)
    proxy.app[PROBES].budget.fit(1024)  # what discovery does when the server has 1,024 per request
    resp = await proxy.post("/api/show", json={"model": "mellum"})
    show = await resp.json()
    assert resp.status == 200, show
    assert continue_show(show) == 1024
