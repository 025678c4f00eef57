"""The `mellum-proxy` command as a user runs it: one-line errors with exit 2, clean exit on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli import main as benchmarks_main
from mellum_proxy.cli import main as proxy_main


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--debounce-ms", "ten"],
        ["serve", "--no-such-flag"],
        ["serve", "--listen", "nowhere"],
        ["serve", "--config", "/nonexistent/c.toml"],
        [],
        ["serve", "--routing-key-header", "X-Session\r\nX-Evil: 1"],
        ["serve", "--upstream-api-key=sk-copied\n"],
        ["serve", "--upstream", "http://127.0.0.1:99999"],
        ["serve", "--upstream", "http://my host:8080"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mellum-proxy")
    assert err.count("\n") == 1 and "sk-copied" not in err


def test_a_boolean_for_a_number_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text("max_tokens = true\n")
    with pytest.raises(SystemExit) as info:
        main(["serve", "--config", str(config)])
    assert info.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_serve_exits_0_on_sigterm(tmp_path: Path, unused_tcp_port: int) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "mellum_proxy", "serve", "--listen", f"127.0.0.1:{unused_tcp_port}",
               "--upstream", "http://127.0.0.1:9"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # blocks until the proxy says it listens
                if "listening on" in line:
                    break
            assert f"listening on http://127.0.0.1:{unused_tcp_port}" in line
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()


def test_ctrl_c_during_start_up_stops_there(tmp_path: Path, unused_tcp_port: int) -> None:
    """Ctrl-C while the proxy still asks its upstream what it is: it stops then, not after saying "ready"."""
    import socket

    env = {**os.environ, "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    with socket.socket() as silent:  # an upstream that accepts and never answers: start-up waits on it
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        command = [sys.executable, "-m", "mellum_proxy", "serve", "--listen", f"127.0.0.1:{unused_tcp_port}",
                   "--upstream", f"http://127.0.0.1:{silent.getsockname()[1]}", "--log", "off"]  # fmt: skip
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
            try:
                silent.settimeout(60)
                connection, _ = silent.accept()  # the proxy is starting: it asks the upstream
                proc.send_signal(signal.SIGINT)
                out = proc.communicate(timeout=10)[0]
                connection.close()
            finally:
                proc.kill()
    assert proc.returncode == 0 and "stopped while starting" in out, out
    assert "ready" not in out and "listening on" not in out and "Traceback" not in out


@pytest.mark.parametrize("extra", [[], ["--embedded"]])
def test_port_in_use_is_one_line_and_exit_2(tmp_path: Path, extra: list[str]) -> None:
    """Said at once, naming --listen: the port is bound before the embedded model loads (it took 21 s)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "mellum_proxy", "serve", "--listen", f"127.0.0.1:{port}", *extra],
            capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mellum-proxy: ") and "--listen" in last and str(port) in last
    assert not re.search(r"ready in [\d.]+ s", result.stdout + result.stderr)  # nothing was loaded


def numeric_flags() -> list[tuple[list[str], str]]:
    """(the command's words, flag) for every option of every command that takes a number."""
    import argparse

    from benchmarks.cli import build_parser as benchmarks_parser
    from mellum_proxy.cli import build_parser
    from mellum_proxy.tuning.cli import build_parser as bench_parser

    found: list[tuple[list[str], str]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*words, name])
            elif action.option_strings and action.type is not None:
                assert action.type not in (int, float), f"{words} {action.option_strings}: unchecked int/float"
                if getattr(action.type, "__name__", "") in ("whole number", "number", "_ints"):
                    found.append((words, action.option_strings[0]))

    walk(build_parser(), [])
    walk(bench_parser(), ["bench"])
    walk(benchmarks_parser(), ["benchmarks"])
    return found


def main(words: list[str]) -> None:
    """`mellum-proxy WORDS`, or `python -m benchmarks REST` for words that start with `benchmarks`."""
    if words[:1] == ["benchmarks"]:
        benchmarks_main(words[1:])
    else:
        proxy_main(words)


FLAGS = numeric_flags()


def test_every_numeric_flag_is_checked() -> None:
    assert len(FLAGS) >= 30 and (["sweep"], "--gpu-gib") in FLAGS


@pytest.mark.parametrize("words,flag", FLAGS, ids=[" ".join([*w, f]) for w, f in FLAGS])
@pytest.mark.parametrize("value", ["-3", "nan", "ten"])
def test_every_numeric_flag_rejects_impossible_values(
    words: list[str], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*words, flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err, err


TRACE = str(
    Path(__file__).resolve().parent.parent / "mellum_proxy" / "tuning" / "traces" / "json-crdt-blog-post.json.gz"
)


@pytest.mark.parametrize(
    "words",
    [
        ["bench", "replay", "--policy", "direct", "--limit-events", "20", TRACE],
        ["benchmarks", "ladder"],
        ["profile"],
        ["baseline", "--idle-s", "1"],
    ],
)
def test_tools_end_in_one_line_when_the_server_never_answers(
    words: list[str], unused_tcp_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a report of zeros (exit 0), a wait that never returns, or the HTML of a web server's error page."""
    argv = [*words, "--upstream", f"http://127.0.0.1:{unused_tcp_port}"]
    if words[0] == "bench" and words[1] == "replay":
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not serve (connection refused" in err[0] and "--upstream" in err[0], err
    assert not (tmp_path / "out").exists()


CONFIGS = Path(__file__).resolve().parent.parent / "mellum_proxy" / "planning" / "configs"


@pytest.mark.parametrize("words", [["stats"], ["inspect", str(CONFIGS / "mellum-4b-base")]])
def test_output_into_a_closed_pipe_ends_quietly(words: list[str], tmp_path: Path) -> None:
    """`mellum-proxy stats | head -1` raised BrokenPipeError in 4 of 6 runs."""
    log = tmp_path / "requests.jsonl"
    line = b'{"event": "request", "id": "a", "outcome": "ok", "ttft_ms": 12.0, "dialect": "openai"}\n'
    log.write_bytes(line * 2000)
    argv = [sys.executable, "-m", "mellum_proxy", *words] + ([str(log)] if words == ["stats"] else [])
    for _ in range(3):
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "HOME": str(tmp_path)}) as proc:  # fmt: skip
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.readline()
            proc.stdout.close()  # as `head -1` does once it has its line
            err = proc.stderr.read().decode()
            assert proc.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_benchmark_asked_of_the_installed_command_says_where_it_moved(capsys: pytest.CaptureFixture[str]) -> None:
    """`mellum-proxy bench overhead` from a script written before the move: one line naming the command to run."""
    with pytest.raises(SystemExit) as exited:
        proxy_main(["bench", "overhead", "--rounds", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and "python -m benchmarks overhead" in err[0]
