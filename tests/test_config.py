"""Settings precedence (CLI > env > TOML > defaults) and readable errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mellum_proxy.clock import LOOP_CLOCK
from mellum_proxy.config import Settings
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.settings_file import SettingsError, load_settings
from mellum_proxy.text_checks import unknown_environment


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults() -> None:
    settings = load_settings()
    assert settings.listen == "127.0.0.1:8011"
    assert settings.upstream == ("http://127.0.0.1:8000",)
    assert settings.max_body_bytes == 4 * 1024 * 1024


def test_precedence_cli_over_env_over_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path / "c.toml", "debounce_ms = 10\nmax_queue = 3\ntimeout_ms = 900\n")
    monkeypatch.setenv("MELLUM_PROXY_DEBOUNCE_MS", "20")
    monkeypatch.setenv("MELLUM_PROXY_MAX_QUEUE", "4")
    settings = load_settings({"debounce_ms": "30"}, config)
    assert settings.debounce_ms == 30  # CLI
    assert settings.max_queue == 4  # env over TOML
    assert settings.timeout_ms == 900  # TOML over default
    assert settings.max_inflight == 1  # default


def test_default_config_file_is_read_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".config/mellum-proxy").mkdir(parents=True)
    write(tmp_path / ".config/mellum-proxy/config.toml", 'listen = "127.0.0.1:9999"\n')
    assert load_settings().listen == "127.0.0.1:9999"


def test_upstream_trailing_v1_is_accepted() -> None:
    assert Settings(upstream="http://localhost:8080/v1/").upstream == ("http://localhost:8080",)


def test_upstreams_in_order_from_every_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--upstream` repeated, a comma-separated environment variable, a TOML string or list."""
    from mellum_proxy.cli import build_parser

    args = build_parser().parse_args(["serve", "--upstream", "http://router:8000/v1", "--upstream", "http://b:1"])
    assert load_settings({"upstream": args.upstream}).upstream == ("http://router:8000", "http://b:1")
    monkeypatch.setenv("MELLUM_PROXY_UPSTREAM", "http://a:1, http://b:2")
    assert load_settings().upstream == ("http://a:1", "http://b:2")
    monkeypatch.delenv("MELLUM_PROXY_UPSTREAM")
    listed = write(tmp_path / "l.toml", 'upstream = ["http://a:1", "http://b:2"]\n')
    assert load_settings(config_file=listed).upstream == ("http://a:1", "http://b:2")
    for bad in ([], ["ftp://a"], "http://a:1, router"):
        with pytest.raises(ValidationError):
            Settings(upstream=bad)


def test_upstream_headers_and_routing_key() -> None:
    settings = Settings(upstream_header=["x-gateway-inference-objective=critical", "X-Team = core"])
    assert settings.headers == {"x-gateway-inference-objective": "critical", "X-Team": "core"}
    assert settings.shown()["upstream_header"] == ["x-gateway-inference-objective=***", "X-Team=***"]
    assert settings.routing_key == "developer" and settings.routing_key_header == "X-Session-Id"
    assert settings.developer_id  # the login name
    with pytest.raises(ValidationError, match="NAME=VALUE"):
        Settings(upstream_header=["no-value"])


def test_unknown_toml_key_names_it(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "debounce_msec = 10\n")
    with pytest.raises(SettingsError, match="unknown setting 'debounce_msec'"):
        load_settings(config_file=config)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"debounce_ms": "ten"}, "'debounce_ms'"),
        ({"max_inflight": "0"}, "'max_inflight'"),
        ({"listen": "localhost"}, "'listen'"),
        ({"upstream": "ftp://x"}, "'upstream'"),
        ({"upstream": "http://"}, "'upstream'.*with a host"),
        ({"log_max_mb": "inf"}, "'log_max_mb'"),
        ({"log_max_mb": "nan"}, "'log_max_mb'"),
        ({"tokenizer": "/etc/hostname"}, "'tokenizer'"),
        ({"upstream_header": ["X-Team=a\r\nInjected: yes"]}, "'upstream_header'.*line break"),
        ({"developer_id": "alice\r\nX-Evil: 1"}, "'developer_id'.*line break"),
        ({"max_tokens": "2048", "max_context_tokens": "2048"}, "max_tokens .2048. must be below max_context_tokens"),
        ({"routing_key_header": "X-Session\r\nX-Evil: 1"}, "'routing_key_header'.*header name"),
        ({"routing_key_header": "X:Session"}, "'routing_key_header'.*header name"),
        ({"upstream_api_key": "sk-secret\n"}, r"'upstream_api_key' = \*\*\*: .*line break"),
        ({"upstream": "http://127.0.0.1:99999"}, "'upstream'.*with a host"),
        ({"upstream": "http://my host:8080"}, "'upstream'.*with a host"),
        ({"listen": "my host:8011"}, "'listen'"),
        ({"max_tokens": True}, "'max_tokens' = True: expected a number"),
    ],
)
def test_invalid_value_names_the_setting(values: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle) as info:
        load_settings(values)
    assert "\n" not in str(info.value)


def test_invalid_env_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MELLUM_PROXY_TIMEOUT_MS", "soon")
    with pytest.raises(SettingsError, match="'timeout_ms'"):
        load_settings()


def test_unknown_environment_variables_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MELLUM_PROXY_TIMEOUT_MSS", "5")
    monkeypatch.setenv("MELLUM_PROXY_REQUIRE_BROWSER", "1")  # the project's own test switch, not a setting
    assert unknown_environment(list(Settings.model_fields)) == [
        "MELLUM_PROXY_TIMEOUT_MSS names no setting (did you mean MELLUM_PROXY_TIMEOUT_MS?)"
    ]


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(config_file=tmp_path / "absent.toml")


def test_broken_toml_is_one_line(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "debounce_ms = = 3\n")
    with pytest.raises(SettingsError, match=r"c\.toml") as info:
        load_settings(config_file=config)
    assert "\n" not in str(info.value)


# Every setting users have today, by its three names: a flag, an environment variable and a TOML key. A setting
# removed or renamed breaks someone's config file or unit: this list changes only with a migration note.
SETTINGS_USERS_HAVE = (
    "listen auth_token upstream upstream_api_key upstream_model upstream_kind upstream_header routing_key "
    "routing_key_header developer_id health_interval_ms embedded model embedded_ctx_tokens embedded_slots "
    "embedded_threads embedded_kv_type max_body_bytes upstream_connect_timeout_ms upstream_answer_timeout_ms "
    "passthrough_timeout_ms "
    "shutdown_timeout_s dispatch debounce_ms hold_idle_max_ms hold_busy_max_ms hold_min_ms hold_gap_factor "
    "reuse "
    "keep_prefill max_inflight max_concurrency max_queue ttft_timeout_ms timeout_ms max_context_tokens max_tokens "
    "prefix_ratio context_step_lines tokenizer fim_template complete_in_comments postprocess stop_at_blank_line "
    "default_temperature log log_max_mb log_content record vram_interval_ms gpu upstream_pid "
    "completion_reserve max_bulk_queue bulk_wait_ms upstream_priority slo_header idle_timeout_ms keep_alive log_keep "
    "embedded_sleep_idle_s embedded_spec embedded_cache_reuse"
).split()


def test_every_setting_users_have_is_a_flag_a_variable_and_a_toml_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mellum_proxy.cli import build_parser

    assert sorted(Settings.model_fields) == sorted(SETTINGS_USERS_HAVE)
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr,index]
    flags = {option for action in serve._actions for option in action.option_strings}
    for name in SETTINGS_USERS_HAVE:
        assert "--" + name.replace("_", "-") in flags, name
    monkeypatch.setenv("MELLUM_PROXY_MAX_QUEUE", "5")
    config = tmp_path / "config.toml"
    config.write_text('max_tokens = 33\nupstream = ["http://127.0.0.1:9"]\n')
    loaded = load_settings({"timeout_ms": 700}, config)
    assert (loaded.timeout_ms, loaded.max_queue, loaded.max_tokens, loaded.upstream) == (
        700, 5, 33, ("http://127.0.0.1:9",))  # fmt: skip
    assert Settings().max_tokens == 128  # the file was read by that load alone


def test_every_section_field_reads_a_setting_that_exists() -> None:
    """A section field reads the setting of its own name, or the one its metadata names: a typo, or a setting
    renamed without its reader, is an error here rather than at start."""
    from dataclasses import fields
    from typing import get_type_hints

    from mellum_proxy.sections import Sections, sections

    settings = Settings()
    for section, cls in get_type_hints(Sections).items():
        if section in ("guards", "hold"):  # built objects, not sections of settings
            continue
        for spec in fields(cls):
            if "derive" not in spec.metadata:
                assert hasattr(settings, spec.metadata.get("setting") or spec.name), (section, spec.name)
    tree = sections(Settings(debounce_ms=100, routing_key="session", log_max_mb=2, upstream_pid=0))
    assert tree.policies.dispatch == "fixed" and tree.hold is not None  # debounce_ms alone: the fixed hold
    request = NormalizedRequest(id="r", route="openai", session="s", prefix="")
    assert tree.hold(LOOP_CLOCK).hold_for(request, True) == 0.1
    assert tree.upstream.route_sessions and tree.upstream.routing_header == "X-Session-Id"
    assert (tree.telemetry.log_max_bytes, tree.telemetry.upstream_pid) == (2 * 1024 * 1024, None)
