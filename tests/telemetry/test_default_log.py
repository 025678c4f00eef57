"""The request log is on by default: `serve` writes it in the user's state folder, without source text, with
an `event` on every line; `stats`, `doctor` and `tune` read it when given no file; `--log off` stops it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.config import Settings
from mellum_proxy.http import RECORDS, TELEMETRY
from mellum_proxy.settings_file import load_settings
from tests.conftest import ProxyFactory

SECRET = "def secret_function_name(x):\n    return "


def state_log() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "mellum-proxy" / "requests.jsonl"


def test_the_log_is_in_the_state_folder_unless_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().log == state_log()
    assert load_settings({"log": "off"}).log is None
    monkeypatch.setenv("MELLUM_PROXY_LOG", "off")
    assert load_settings({}).log is None


async def test_serve_writes_it_by_default_with_an_event_on_every_line_and_no_text(
    make_proxy: ProxyFactory, fake_upstream: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars", reuse=True)
    for typed in ("", "t0 "):  # the second types through the first's suggestion: an acceptance line is written
        resp = await proxy.post("/v1/completions", json={"prompt": SECRET + typed, "suffix": "\n"})
        assert resp.status == 200
    await proxy.post("/v1/completions", json={"prompt": "x = 1\n", "suffix": ""})  # settles the suggestion
    sink = proxy.app[TELEMETRY].log
    assert sink is not None and sink.path == state_log()
    await sink.flushed()
    raw = state_log().read_bytes()
    assert b"secret_function_name" not in raw  # lengths and hashes, not the code
    lines = [orjson.loads(line) for line in raw.splitlines()]
    assert {line["event"] for line in lines} == {"request", "acceptance"}
    main(["stats", "--json"])  # no file: the one serve writes
    assert orjson.loads(capsys.readouterr().out)["all"]["requests"] == 3
    main(["doctor"])
    assert capsys.readouterr().out.startswith("verdict:")


def test_without_a_log_stats_and_doctor_say_why_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["stats"], ["doctor"]):
        with pytest.raises(SystemExit) as exited:
            main(command)
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"no request log at {state_log()} yet" in err[0]


def test_tune_reads_the_request_log_as_typing(tmp_path: Path) -> None:
    """Its timing and sizes: each request an edit in its session, no text to type through."""
    from mellum_proxy.tuning.runners.tune import read_typing
    from mellum_proxy.tuning.workloads.trace import Edit, Open

    log = tmp_path / "requests.jsonl"
    lines = [{"event": "request", "id": f"r{i}", "session": "s", "received_at": 100 + i * 0.2, "prompt_chars": 10 + i,
              "suffix_chars": 3, "outcome": "ok"} for i in range(3)]  # fmt: skip
    lines.insert(2, {"event": "acceptance", "id": "r0", "session": "s", "accepted_chars": 1})
    log.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    events = read_typing(log)
    assert [type(e) for e in events] == [Open, Edit, Edit, Edit]
    assert [e.t_ms for e in events] == [0, 0, 200, 400]


async def test_a_records_time_counts_from_its_arrival(make_proxy: ProxyFactory, fake_upstream: Any) -> None:
    """A body that takes 300 ms to arrive: the record's time includes it (it counted from the parsed body)."""
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, tokenizer="chars", reuse=False)

    async def slowly() -> Any:
        yield b'{"prompt": "def f(", '
        await asyncio.sleep(0.3)  # the client, not a synchronization: its body's second half comes later
        yield b'"suffix": ")"}'

    resp = await proxy.post("/v1/completions", data=slowly(), headers={"Content-Type": "application/json"})
    assert resp.status == 200
    record = proxy.app[RECORDS].last()
    # it counted from the parsed body (a few ms) before; the handler may start a little after the client's first
    # half left it, on busy cores 1 ms once: the bound keeps a margin both ways
    assert record.total_ms is not None and record.total_ms >= 250
