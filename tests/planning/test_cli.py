"""The planner commands as a user runs them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.planning.inspect import BUNDLED


def test_inspect_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    main(["inspect", str(BUNDLED / "mellum2.1-12b-a2.5b")])
    out = capsys.readouterr().out
    assert "7 full attention, 21 sliding-window of 1024" in out
    assert "12.15 B total, 2.44 B active" in out and "56.0 KiB" in out


def test_sweep_with_only_total_b_says_the_arch_was_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    main(["sweep", "--total-b", "7", "--gpu-gib", "12", "--contexts", "4096", "--batches", "1,2", "--json"])
    body = orjson.loads(capsys.readouterr().out)
    assert any("architecture assumed" in note for note in body["notes"])
    assert body["best"]["context"] == 4096


def test_sweep_writes_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid.csv"
    main(["sweep", "--model", str(BUNDLED / "mellum-4b-base"), "--gpu-gib", "16", "--csv", str(out),
          "--contexts", "2048,8192", "--batches", "1,2"])  # fmt: skip
    rows = out.read_text().splitlines()
    assert rows[0].startswith("quant,context,batch,weights_bytes") and len(rows) == 1 + 3 * 2 * 2
    assert "best:" in capsys.readouterr().out


def test_defaults_writes_the_env_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / "defaults.env"
    main(["defaults", "--model", str(BUNDLED / "mellum2.1-12b-a2.5b"), "--gpu-gib", "16", "--context", "8192",
          "--backend", "llama.cpp", "--out", str(env)])  # fmt: skip
    assert env.read_text().startswith("MODEL_QUANT=")
    assert "--max-model-len 8192" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "/nonexistent/model"],
        ["sweep", "--total-b", "7", "--gpu-gib", "12", "--quants", "q4,zz9"],
        ["sweep", "--total-b", "7", "--gpu-gib", "12", "--contexts", "4k"],
        ["sweep", "--total-b", "7", "--gpu-gib", "12", "--arch", "gpt5"],
        ["sweep", "--total-b", "7", "--gpu-gib", "12", "--margin", "1.5"],
        ["defaults", "--model", str(BUNDLED / "mellum2.1-12b-a2.5b"), "--gpu-gib", "2", "--context", "8192"],
        ["doctor", "/nonexistent/log.jsonl"],
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_documented_defaults_example_reproduces_and_writes_no_file_unasked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/vram-planning.md's `defaults` example, run with the flags it shows, prints what it says; without
    `--out` nothing is written to the current folder (a `defaults.env` appeared there before)."""
    monkeypatch.chdir(tmp_path)
    main(["defaults", "--model", str(BUNDLED / "mellum2.1-12b-a2.5b"), "--gpu-gib", "12", "--context", "16384",
          "--bpw", "q4=5.33", "--backend", "llama.cpp"])  # fmt: skip
    out = capsys.readouterr().out
    assert "MODEL_QUANT=q5" in out and "BATCH_DEFAULT=1" in out and "-c 16384 -np 1 -ctk f16 -ctv f16 -ngl 99" in out
    assert "the most precise quantization OK there (q5; q4 fits too and loses more)" in out
    assert list(tmp_path.iterdir()) == []
    page = (Path(__file__).resolve().parents[2] / "docs" / "vram-planning.md").read_text()
    assert "MODEL_QUANT=q5" in page and "(q5; q4 fits too and loses more)" in page
    assert "-c 16384 -np 1 -ctk f16 -ctv f16 -ngl 99" in page


def test_sweep_says_the_assumption_once_and_what_would_fit(capsys: pytest.CaptureFixture[str]) -> None:
    main(["sweep", "--total-b", "12", "--gpu-gib", "4"])
    out = capsys.readouterr().out
    assert out.count("architecture assumed") == 1
    assert "the smallest there (q4, batch 1: 12.35 GiB) is OK on a 16.5 GiB card, or lower --context" in out
