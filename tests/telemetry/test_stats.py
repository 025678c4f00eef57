"""`mellum-proxy stats`: counts, percentiles, groups; malformed lines are counted, not fatal."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.telemetry.stats import percentile, read_log, stats


def write_log(path: Path) -> Path:
    lines = [orjson.dumps({"outcome": "ok", "session": "a", "ttft_ms": t, "total_ms": t * 2, "queue_ms": 0.0,
                           "reached_upstream": True, "vram_peak_mib": 900 + t}) for t in range(1, 11)]  # fmt: skip
    lines.append(orjson.dumps({"outcome": "debounced", "session": "b", "ttft_ms": None}))
    lines += [b"{not json", b"[1, 2]"]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50, 90, 99)
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0


def test_summary(tmp_path: Path) -> None:
    records, malformed = read_log(write_log(tmp_path / "r.jsonl"))
    result = stats(records, malformed, by="outcome")
    assert result["malformed_lines"] == 2
    summary = result["all"]
    assert summary["requests"] == 11
    assert summary["outcomes"] == {"ok": 10, "debounced": 1}
    assert summary["ttft_ms"] == {"p50": 5.0, "p90": 9.0, "p99": 10.0}
    assert summary["vram_peak_mib"] == 910
    assert summary["upstream_per_request"] == pytest.approx(10 / 11)
    assert set(result["groups"]) == {"ok", "debounced"}


def test_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "r.jsonl")
    main(["stats", str(log), "--by", "session"])
    table = capsys.readouterr().out
    assert "ok=10" in table and "2 malformed lines skipped" in table
    main(["stats", str(log), "--json"])
    assert orjson.loads(capsys.readouterr().out)["all"]["requests"] == 11


def test_missing_log_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["stats", str(tmp_path / "absent.jsonl")])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
