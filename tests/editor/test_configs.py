"""Editor configs parse, name the proxy's address, match the templates; the service unit is valid."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import plistlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from mellum_proxy.cli import main
from mellum_proxy.config import Settings
from mellum_proxy.editor import service
from mellum_proxy.editor.cli import running_settings
from mellum_proxy.editor.configs import CONFIGS, render
from mellum_proxy.http import PROBES

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "editor-configs"


def jsonc(text: str) -> object:
    return json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_shipped_config_equals_its_template_with_defaults(name: str) -> None:
    assert (CONFIG_DIR / CONFIGS[name]).read_text() == render(name, Settings())


def test_the_docs_show_the_config_that_fits_make_run() -> None:
    """Each plugin's page renders what `make run` (`serve --embedded`) needs: its longer deadline and shorter
    completions, not the defaults for a GPU server (docs/hooks/editor_configs.py, written into the page)."""
    spec = importlib.util.spec_from_file_location("editor_configs", ROOT / "docs" / "hooks" / "editor_configs.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    marked = {page.stem: page.read_text() for page in (ROOT / "docs" / "editors").glob("*.md")
              if "<!-- editor-config" in page.read_text()}  # fmt: skip
    assert len(marked) == len(CONFIGS)
    minuet = hook.render_page(marked["minuet"])
    assert "request_timeout = 3.5" in minuet and "max_tokens = 48" in minuet
    assert minuet.count("<!-- editor-config minuet") == 1 and minuet.count("<!-- /editor-config -->") == 1
    with pytest.raises(hook.UnknownPlugin):
        hook.render_page("    <!-- editor-config emacs embedded lisp -->")


def test_editor_config_takes_serves_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """The same flags as `serve`, `--embedded` included, give the settings `serve` would run with."""
    main(["editor-config", "minuet", "--embedded", "--listen", "127.0.0.1:9124"])
    out = capsys.readouterr().out
    assert "http://127.0.0.1:9124/v1/completions" in out and "request_timeout = 3.5" in out
    assert "max_tokens = 48" in out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_names_the_default_address(name: str) -> None:
    text = (CONFIG_DIR / CONFIGS[name]).read_text()
    assert "127.0.0.1:8011" in text or ("127.0.0.1" in text and "8011" in text)
    assert text.splitlines()[0].startswith(("#", "//", '"', "--"))  # a header says where it goes


def test_structured_configs_parse() -> None:
    cont = yaml.safe_load((CONFIG_DIR / "continue.yaml").read_text())
    assert {m["provider"] for m in cont["models"]} == {"ollama", "openai"}
    assert [m["roles"] for m in cont["models"]] == [["autocomplete"], ["autocomplete"], ["chat", "edit", "apply"]]
    assert cont["models"][2]["apiBase"] == "http://127.0.0.1:8011/v1"  # chat through the proxy: its bulk lane
    assert cont["models"][0]["autocompleteOptions"]["modelTimeout"] == 2000  # the deadline, and room for the answer
    vscode = jsonc((CONFIG_DIR / "llama-vscode.json").read_text())
    assert isinstance(vscode, dict) and vscode["llama-vscode.endpoint"] == "http://127.0.0.1:8011"
    # llama.vscode src/llama-server.ts: ENDPOINT_CHAT/v1/chat/completions, ENDPOINT_TOOLS/v1/chat/completions
    assert vscode["llama-vscode.endpoint_chat"] == vscode["llama-vscode.endpoint_tools"] == "http://127.0.0.1:8011"
    zed = jsonc((CONFIG_DIR / "zed.json").read_text())
    assert isinstance(zed, dict) and zed["language_models"]["openai_compatible"]["mellum-proxy"]["api_url"] == (
        "http://127.0.0.1:8011/v1"
    )
    twinny = jsonc((CONFIG_DIR / "twinny.json").read_text())
    assert isinstance(twinny, dict) and twinny["twinny.debounceWait"] == 1  # the proxy's adaptive hold decides
    tabby = tomllib.loads((CONFIG_DIR / "tabby.toml").read_text())
    assert tabby["model"]["completion"]["http"]["kind"] == "llama.cpp/completion"


def test_configs_follow_the_plugins_current_settings() -> None:
    """Each against the plugin's own source: llama.vim autoload/llama.vim (`endpoint_fim`; `endpoint` is
    deprecated); llama.vscode package.json (`max_parallel_completions`); minuet's README (a frontend that
    auto-triggers); Continue's autocomplete options (`maxPromptTokens` is the prompt alone)."""
    assert "'endpoint_fim': 'http://127.0.0.1:8011/infill'" in (CONFIG_DIR / "llama-vim.vim").read_text()
    assert "'endpoint'" not in (CONFIG_DIR / "llama-vim.vim").read_text()
    vscode = jsonc((CONFIG_DIR / "llama-vscode.json").read_text())
    assert vscode["llama-vscode.max_parallel_completions"] == 1  # type: ignore[index]
    assert "auto_trigger_ft = { '*' }" in (CONFIG_DIR / "minuet.lua").read_text()
    settings = Settings()
    for model in yaml.safe_load((CONFIG_DIR / "continue.yaml").read_text())["models"][:2]:  # the autocomplete ones
        prompt, out = model["autocompleteOptions"]["maxPromptTokens"], model["defaultCompletionOptions"]["maxTokens"]
        assert prompt + out <= settings.max_context_tokens
    jetbrains = (CONFIG_DIR / "jetbrains-ai-assistant.md").read_text()
    assert "AI Completion" in jetbrains and "OpenAI-compatible" in jetbrains and "Output limit: 128" in jetbrains
    assert "starcoder" in (CONFIG_DIR / "twinny.json").read_text()


def test_plugin_timeouts_leave_room_for_the_proxys_deadline_answer() -> None:
    """A plugin with a timeout of its own must still be listening when the proxy answers at `timeout_ms`:
    minuet's `request_timeout` is curl's `--max-time` (lua/minuet/utils.lua `make_curl_args`; with `stream =
    false` a timed-out curl yields nothing), Continue's `modelTimeout` aborts its request."""
    for timeout_ms in (300, 1500, 4000):
        settings = Settings(timeout_ms=timeout_ms)
        minuet = render("minuet", settings)
        limit = float(minuet.split("request_timeout = ")[1].split(",")[0])
        assert limit * 1000 >= timeout_ms + 250
        for model in yaml.safe_load(render("continue", settings))["models"]:
            if "autocomplete" in model["roles"]:
                assert model["autocompleteOptions"]["modelTimeout"] >= timeout_ms + 250


def test_minuets_config_can_accept_a_suggestion() -> None:
    """minuet maps no key by default (lua/minuet/config.lua `virtualtext.keymap`: all nil at 479487c)."""
    text = (CONFIG_DIR / "minuet.lua").read_text()
    keymap = text.split("keymap = {")[1].split("}")[0]
    assert "accept = '<A-A>'" in keymap and "accept_line = '<A-a>'" in keymap and "dismiss" in keymap


def test_configs_carry_the_auth_token_when_the_proxy_has_one() -> None:
    settings = Settings(auth_token="s3cret-token")
    assert "'api_key': 's3cret-token'" in render("llama-vim", settings)
    assert '"llama-vscode.api_key": "s3cret-token"' in render("llama-vscode", settings)
    assert all(m["apiKey"] == "s3cret-token" for m in yaml.safe_load(render("continue", settings))["models"])
    assert tomllib.loads(render("tabby", settings))["model"]["completion"]["http"]["api_key"] == "s3cret-token"
    assert "api_key = 'MELLUM_PROXY_AUTH_TOKEN'" in render("minuet", settings)


@pytest.mark.skipif(shutil.which("vim") is None, reason="vim is not installed")
def test_llama_vim_config_is_valid_vim_script(tmp_path: Path) -> None:
    check = tmp_path / "check.vim"
    expect = "if g:llama_config.endpoint_fim !=# 'http://127.0.0.1:8011/infill' | cquit 3 | endif"
    check.write_text(f"source {CONFIG_DIR / 'llama-vim.vim'}\n{expect}\nqall!\n")
    result = subprocess.run(["vim", "-u", "NONE", "-N", "-es", "-S", str(check)], capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_minuet_config_is_lua() -> None:
    """No Lua interpreter is installed here, so this is a lexer check: no token Pygments cannot place."""
    from pygments.lexers import LuaLexer
    from pygments.token import Error

    text = (CONFIG_DIR / "minuet.lua").read_text()
    assert not [value for kind, value in LuaLexer().get_tokens(text) if kind in Error]
    assert text.count("{") == text.count("}")
    if shutil.which("luac"):
        assert subprocess.run(["luac", "-p", str(CONFIG_DIR / "minuet.lua")], timeout=10).returncode == 0


def test_editor_config_command_uses_the_running_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text('listen = "127.0.0.1:9123"\ntimeout_ms = 900\n')
    main(["editor-config", "minuet", "--config", str(config)])
    out = capsys.readouterr().out
    assert "http://127.0.0.1:9123/v1/completions" in out and "request_timeout = 1.4" in out


def test_systemd_unit_runs_serve_with_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    files = service.plan(config, unit_dir=tmp_path / "units", platform="systemd")
    service.write(files)
    unit = files.unit_path.read_text()
    assert f"-m mellum_proxy serve --config {config}" in unit
    assert "Restart=on-failure" in unit and "WantedBy=default.target" in unit
    if shutil.which("systemd-analyze"):
        result = subprocess.run(["systemd-analyze", "verify", str(files.unit_path)], capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        assert result.returncode == 0, result.stderr


def test_launchd_agent(tmp_path: Path) -> None:
    files = service.plan(tmp_path / "c.toml", unit_dir=tmp_path, platform="launchd")
    service.write(files)
    agent = plistlib.loads(files.unit_path.read_bytes())
    assert agent["Label"] == "dev.mellum-proxy" and agent["ProgramArguments"][-2:] == [
        "--config",
        str(tmp_path / "c.toml"),
    ]
    assert agent["KeepAlive"] == {"SuccessfulExit": False} and agent["RunAtLoad"] is True


def test_service_install_and_uninstall_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    units, config = tmp_path / "units", tmp_path / "cfg" / "config.toml"
    main(["service", "install", "--config", str(config), "--unit-dir", str(units), "--no-activate"])
    assert config.exists() and (units / "mellum-proxy.service").exists()
    main(["service", "status", "--config", str(config), "--unit-dir", str(units)])
    assert "installed at" in capsys.readouterr().out
    main(["service", "uninstall", "--config", str(config), "--unit-dir", str(units), "--no-activate"])
    assert not (units / "mellum-proxy.service").exists()


@pytest.mark.skipif(sys.platform == "darwin", reason="systemd's commands; launchd's take the same path")
def test_service_install_fails_when_the_service_manager_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`systemctl --user` refusing (no user bus: a container, an ssh session without lingering) is exit 1 with its
    reason, not a note under a 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    units, config = tmp_path / "units", tmp_path / "config.toml"
    for action in ("install", "uninstall"):
        with pytest.raises(SystemExit) as info:
            main(["service", action, "--config", str(config), "--unit-dir", str(units)])
        err = capsys.readouterr().err
        assert info.value.code == 1 and f"service {action}: systemctl --user" in err and "No medium found" in err
    assert (units / "mellum-proxy.service").exists()  # kept: the service may still run from it


def test_service_refuses_a_broken_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text("debounce_ms = 'soon'\n")
    with pytest.raises(SystemExit) as info:
        main(["service", "install", "--config", str(config), "--unit-dir", str(tmp_path), "--no-activate"])
    assert info.value.code == 2 and "debounce_ms" in capsys.readouterr().err


async def test_editor_config_reads_the_running_proxy_and_says_so(
    make_proxy: Any, fake_upstream: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proxy runs at the address the flags name: its settings (here a 900 ms deadline and the 1,024-token
    context its server allows) go into the plugin's config, not the flags' defaults, and stderr names it."""
    _, url = await fake_upstream()
    proxy = await make_proxy(upstream=url, timeout_ms=900, debounce_ms=100, tokenizer="chars")
    proxy.app[PROBES].budget.fit(1024)  # what discovery does for a server with 1,024 tokens per request
    listen = f"127.0.0.1:{proxy.port}"
    await asyncio.to_thread(main, ["editor-config", "continue", "--listen", listen])
    out, err = capsys.readouterr()
    assert f"the proxy running at http://{listen}/status" in err
    assert "modelTimeout: 1400" in out and "maxPromptTokens: 896" in out and "debounceDelay: 100" in out
    await asyncio.to_thread(main, ["editor-config", "continue", "--listen", listen, "--offline"])
    out, err = capsys.readouterr()
    assert err == "" and "modelTimeout: 2000" in out


GOOD = {"dispatch": "adaptive", "debounce_ms": 0, "timeout_ms": 900, "max_context_tokens": 2048, "max_tokens": 64}


@pytest.mark.parametrize(
    "crafted",
    [
        {"settings": {**GOOD, "debounce_ms": float("nan")}},
        {"settings": {**GOOD, "timeout_ms": -5}},
        {"settings": {**GOOD, "dispatch": None}},
        {"settings": {**GOOD, "max_context_tokens": []}},
        {"settings": "none"},
        {"settings": {"dispatch": "adaptive"}},
        [1, 2],
    ],
)
async def test_editor_config_trusts_no_status_it_cannot_validate(
    crafted: Any, aiohttp_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A /status answer that would write `nan`, a Lua nil or a negative timeout into the config (or crash the
    command) is said and set aside: the config comes from the flags."""

    async def status(request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(crafted).encode(), content_type="application/json")  # NaN as written

    app = web.Application()
    app.router.add_get("/status", status)
    server = await aiohttp_server(app)
    listen = f"127.0.0.1:{server.port}"
    await asyncio.to_thread(main, ["editor-config", "continue", "--listen", listen])
    out, err = capsys.readouterr()
    assert "modelTimeout: 2000" in out and "nan" not in out.lower()  # the flags' defaults
    if isinstance(crafted, dict) and isinstance(crafted.get("settings"), dict):
        assert "do not hold" in err and "using the flags" in err


async def test_editor_config_reads_no_more_of_a_status_than_a_proxy_sends(
    aiohttp_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A /status of 256 MB (not a proxy's) is read only up to the limit: the config comes from the flags, with a
    warning, and the command never holds the whole answer."""
    sent = [0]

    async def status(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = 256 << 20
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            await resp.write(b'{"settings": {"x": "')
            for _ in range(256):
                await resp.write(b"a" * (1 << 20))
                sent[0] += 1 << 20
        return resp

    app = web.Application()
    app.router.add_get("/status", status)
    server = await aiohttp_server(app)
    await asyncio.to_thread(main, ["editor-config", "continue", "--listen", f"127.0.0.1:{server.port}"])
    out, err = capsys.readouterr()
    assert "modelTimeout: 2000" in out and "sent over 4 MB" in err and "using the flags" in err
    assert sent[0] < 256 << 20  # the command hung up early


async def test_editor_config_gives_up_on_a_status_that_trickles(aiohttp_server: Any) -> None:
    async def status(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            while True:  # a byte at a time: each read is within the socket's timeout, the whole is not
                await resp.write(b" ")
                await asyncio.sleep(0.05)
        return resp

    app = web.Application()
    app.router.add_get("/status", status)
    server = await aiohttp_server(app)
    settings = Settings(listen=f"127.0.0.1:{server.port}")
    async with asyncio.timeout(10):  # the old reader waited for the end, which never comes
        assert await asyncio.to_thread(running_settings, settings, 0.3) is None
