"""`benchmarks overhead`: every path really carries completions (the floor and the proxy also each in a process of
its own, their CPU counted), and the report has every round."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from benchmarks.cli import main
from benchmarks.reporting.overhead_report import render
from benchmarks.runners.overhead import RELAYS, measure
from mellum_proxy.config import default_log_path


async def test_every_round_measures_both_relays_and_the_proxy() -> None:
    lines: list[str] = []
    result = await measure(requests=5, rounds=2, tokens=4, progress=lines.append)
    assert [row["round"] for row in result["rows"]] == [1, 2] and len(lines) == 2
    assert not default_log_path().exists()  # its proxies log, but never into the user's own request log
    for row in result["rows"]:
        assert row["direct"]["ttft_p50_ms"] > 0
        for path in result["paths"][1:]:  # page: a proxy with its live page open; nginx where installed
            assert set(row[path]) == {"added_ttft_p50_ms", "added_total_p50_ms", "added_ttft_p95_ms",
                                      "cpu_ms_per_request"}  # fmt: skip
    keys = {"added_ttft_p50_ms", "added_total_p50_ms", "cpu_ms_per_request"}
    ratios = (
        "proxy_over_bare",
        "parsing_over_bare",
        "proxy_over_parsing",
        "proxy_over_nginx",
        "cleaning_over_proxy",
        "page_over_proxy",
        "proxy_process_over_parsing_process",
        "proxy_process_over_nginx",
    )
    assert set(result["summary"]) == {f"{ratio}_{key}" for key in keys for ratio in ratios}
    report = render(result, "python -m benchmarks overhead")
    assert all(report.count(f"| {path} |") == 2 for path in result["paths"][1:])
    assert set(result["paths"]) >= set(RELAYS) - {"nginx"}  # every path but nginx, which is measured where installed
    assert {"parsing_process", "proxy_process"} <= set(result["paths"])  # each in a process of its own


def test_cli_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(
        ["overhead", "--requests", "3", "--rounds", "1", "--tokens", "2", "--token-gap-ms", "1", "--out", f"{tmp_path}"]
    )
    data = orjson.loads((tmp_path / "overhead.json").read_bytes())
    assert data["requests"] == 3 and len(data["rows"]) == 1 and data["token_gap_ms"] == 1.0
    report = (tmp_path / "overhead.md").read_text()
    assert "# Relay overhead" in report and "2 tokens each 1 ms apart (a read each)" in report
    assert "round 1:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--requests", "0", "at least 1"), ("--rounds", "0", "at least 1"), ("--tokens", "0", "at least 1"),
     ("--token-gap-ms", "-1", "at least 0")],
)  # fmt: skip
def test_impossible_numbers_are_one_line_and_exit_2(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["overhead", flag, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"must be {said}" in err[-1]


def test_added_latency_is_read_at_the_50th_and_95th_percentiles() -> None:
    from benchmarks.runners.overhead import PathRound, _row

    direct = PathRound(ttft_ms=[1.0] * 100, total_ms=[2.0] * 100)
    slow_tail = [1.0 + i / 100 for i in range(100)]  # added 0.00 .. 0.99 ms
    measured = {"direct": direct, **{name: PathRound(ttft_ms=slow_tail, total_ms=[2.5] * 100) for name in
                                     ("bare", "parsing", "proxy", "cleaning", "page")}}  # fmt: skip
    row = _row(0, measured, requests=100)
    assert row["proxy"]["added_ttft_p50_ms"] == pytest.approx(0.49)  # the median, not the 0.5th percentile
    assert row["proxy"]["added_ttft_p95_ms"] == pytest.approx(0.94)
    assert row["proxy"]["added_total_p50_ms"] == pytest.approx(0.5)


def test_the_parsing_floor_is_written_without_the_package() -> None:
    """A floor that used the proxy's own reader would move with the code it judges."""
    import ast

    from benchmarks.doubles import floor_relay

    tree = ast.parse(Path(floor_relay.__file__).read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported and not [name for name in imported if name.startswith("mellum_proxy")]


async def test_a_relay_in_its_own_process_has_its_cpu_over_the_round_added(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its CPU is that process's (read before and after the round: /proc counts in 10 ms ticks), on top of this
    process's part of its requests."""
    import aiohttp

    from benchmarks.doubles.fake_upstream import FakeUpstream
    from benchmarks.runners import overhead
    from mellum_proxy.http import serve_app

    readings = iter([2.0, 2.25])  # the relay process's CPU seconds before and after
    monkeypatch.setattr(overhead, "cpu_seconds", lambda pid: next(readings))
    body = {"prompt": "a", "suffix": "b", "max_tokens": 2, "stream": True}
    async with serve_app(FakeUpstream(tokens=2).app()) as url, aiohttp.ClientSession() as session:
        measured = await overhead._round(session, {"direct": url, "own": url}, 5, body, pids={"own": 4242})
    # the relay's quarter second on top of this process's part, which is about direct's (a few ms of CPU)
    assert measured["own"].cpu_s - 0.25 == pytest.approx(measured["direct"].cpu_s, abs=0.05)


def test_a_relay_process_that_does_not_start_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import contextlib
    from collections.abc import AsyncIterator, Sequence

    from benchmarks.runners import overhead

    @contextlib.asynccontextmanager
    async def dies(argv: Sequence[str], port: int) -> AsyncIterator[int]:
        if port < 0:  # never: this is an async generator that raises before it yields
            yield port
        raise RuntimeError(f"{argv[2]} exited with 1")

    monkeypatch.setattr(overhead, "listening", dies)
    with pytest.raises(SystemExit) as stopped:
        main(["overhead", "--requests", "1", "--rounds", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1
    assert "did not start" in err[0] and "exited with 1" in err[0]


@pytest.mark.slow  # seconds of real time
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stop_the_bench_and_everything_it_started(tmp_path: Path, signum: int) -> None:
    """A `timeout` or a closed terminal mid-run: its relays, page reader and nginx (where installed) stopped, their
    temp folders gone, one line and exit 130, no traceback."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "benchmarks", "overhead", "--rounds", "50", "--out", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[2]) as bench:  # fmt: skip
        assert bench.stdout is not None
        for line in bench.stdout:  # a round done: every relay is up
            if line.startswith("round 1"):
                break
        started = _descendants(bench.pid)
        assert started, "the bench started no process"
        bench.send_signal(signum)
        rest = bench.communicate(timeout=60)[0]
    assert bench.returncode == 130 and "Traceback" not in rest and "interrupted" in rest, rest
    assert [pid for pid in started if Path(f"/proc/{pid}").exists()] == []
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("mellum-")] == []


def _descendants(pid: int) -> list[int]:
    children = [int(p) for task in Path(f"/proc/{pid}/task").iterdir()
                for p in (task / "children").read_text().split()]  # fmt: skip
    return children + [grandchild for child in children for grandchild in _descendants(child)]
