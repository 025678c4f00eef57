"""Settings: one frozen model, filled from CLI > environment `MELLUM_PROXY_*` > TOML file > defaults.

Each field is at once a CLI flag (`debounce_ms` -> `--debounce-ms`), an environment variable
(`MELLUM_PROXY_DEBOUNCE_MS`) and a TOML key (`debounce_ms = 150`). The precedence is written once,
in `Settings.settings_customise_sources`.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mellum_proxy.policies import PolicySettings, chosen_hold, hold_named, hold_names
from mellum_proxy.text_checks import has_blank_or_control, has_control, is_header_name, is_server_url
from mellum_proxy.upstream.embedded import checked_spec
from mellum_proxy.upstream.servers import kind_names
from mellum_proxy.urls import redact_url, upstream_base_url


def login_name() -> str:
    """The developer's login name (the default routing key), or `developer` when it cannot be read."""
    try:
        return getpass.getuser() or "developer"
    except (KeyError, OSError):  # no name for this uid (a container)
        return "developer"


def _true(value: Any) -> bool:
    """A boolean setting as any source gives it (the environment and the CLI give strings)."""
    return value is True or (isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"))


NUMBERS = (int, float, int | None, float | None)


def _listed(value: Any) -> Any:
    """A list setting from one string (the environment, a TOML string): comma-separated values."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# What `--embedded` (the packaged gemma-3-270m on this machine's CPU, no --upstream) changes, unless set: a CPU
# prefills ~100-200 tokens/s and decodes ~35 (one thread, `benchmarks first-run`), so a new file's first prompt takes
# 1-2 s before its first token and a 128-token answer 4 s. Completions end at a blank line and at 48 tokens, and
# the deadline leaves room for a cold prompt: a complete suggestion shows, later than from a GPU server.
EMBEDDED_DEFAULTS: dict[str, Any] = {"timeout_ms": 3000, "max_tokens": 48, "stop_at_blank_line": True}


def state_dir() -> Path:
    """Where the proxy keeps what it writes for its user: `$XDG_STATE_HOME/mellum-proxy` (Linux,
    `~/.local/state/mellum-proxy` by default), `~/Library/Logs/mellum-proxy` (macOS)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Logs" / "mellum-proxy"
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "mellum-proxy"


def default_log_path() -> Path:
    """The request log `serve` writes unless told otherwise, and `stats`, `doctor` and `tune` read by default."""
    return state_dir() / "requests.jsonl"


class Settings(PolicySettings, BaseSettings):
    """Everything `mellum-proxy serve` can be told. Units are in the names. The guards' settings are declared
    beside each guard (`mellum_proxy.policies`) and inherited."""

    model_config = SettingsConfigDict(env_prefix="MELLUM_PROXY_", extra="forbid", frozen=True)

    # --- where we listen and what we talk to -------------------------------------------------
    listen: str = Field("127.0.0.1:8011", description="HOST:PORT to listen on (loopback by default).")
    auth_token: str | None = Field(
        None, min_length=8, description="When set, every request must carry `Authorization: Bearer TOKEN`."
    )
    upstream: Annotated[tuple[str, ...], NoDecode] = Field(
        ("http://127.0.0.1:8000",),
        description="Base URL of the model server (a trailing /v1 is accepted); repeat it for fallbacks, in order.",
    )
    upstream_api_key: str | None = Field(
        None, description="Sent to the upstream as `Authorization: Bearer KEY` (vLLM --api-key, LM Studio, a router)."
    )
    upstream_model: str | None = Field(
        None, description="Model name sent upstream (default: the one model the upstream lists in /v1/models)."
    )
    upstream_kind: str = Field(
        "auto", description=f"What the upstream is: auto (told apart by what it answers), {', '.join(kind_names())}."
    )
    upstream_header: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="NAME=VALUE sent on every upstream request (a gateway token, an llm-d objective); repeatable."
    )
    routing_key: Literal["developer", "session", "none"] = Field(
        "developer", description="What keys a router's sticky routing: the developer, the editor session, or none."
    )
    routing_key_header: str = Field(
        "X-Session-Id", min_length=1, description="Header the routing key goes in (vllm-router's consistent hashing)."
    )
    developer_id: str = Field(
        default_factory=login_name, min_length=1, description="This developer's routing key (default: login name)."
    )
    health_interval_ms: int = Field(
        1000, ge=50, description="How often each upstream's health is checked (a lone one too: its changes are said)."
    )
    keep_alive: str = Field(
        "30m", pattern=r"^(-1|0|\d+(\.\d+)?(ms|s|m|h)?)$",
        description="How long an Ollama server keeps the model loaded after a request (sent as its `keep_alive`).",
    )  # fmt: skip
    embedded: bool = Field(
        False, description="Start an in-process llama.cpp server: the upstream, or the last fallback after --upstream."
    )
    model: Path | None = Field(None, description="GGUF for --embedded (default: the packaged gemma-3-270m).")
    embedded_ctx_tokens: int = Field(4096, ge=256, description="Embedded server's total context (all slots).")
    embedded_slots: int = Field(2, ge=1, le=64, description="Embedded server's parallel slots.")
    embedded_threads: int = Field(0, ge=0, description="Embedded server's CPU threads (0: half the cores).")
    embedded_sleep_idle_s: int = Field(
        0, ge=0, le=86_400, description="Embedded server unloads its model after this long idle (0: never)."
    )
    embedded_kv_type: Literal["f16", "bf16", "q8_0", "q4_0"] = Field(
        "f16", description="Embedded server's KV cache type (`mellum-proxy fit` measures the choice)."
    )
    embedded_spec: Annotated[str, AfterValidator(checked_spec)] = Field(
        "none", description="Embedded server's speculation: an n-gram type, draft-mtp or draft:FILE (`fit --spec`)."
    )
    embedded_cache_reuse: int = Field(0, ge=0, description="Embedded server's KV shifting (--cache-reuse N; 0: off).")

    # --- request handling --------------------------------------------------------------------
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body accepted.")
    upstream_connect_timeout_ms: int = Field(1000, ge=1, description="Give up connecting after this long.")
    upstream_answer_timeout_ms: int = Field(
        5000, ge=0, description="Longest wait for a completion's answer to start (status, headers; 0: none)."
    )
    passthrough_timeout_ms: int = Field(
        30000, ge=0, description="Longest silence from the upstream on forwarded routes (chat, models; 0: none)."
    )
    shutdown_timeout_s: float = Field(5.0, ge=0, description="Grace period for in-flight requests on exit.")
    idle_timeout_ms: int = Field(
        30000, ge=100, le=3_600_000, description="Close a client's keep-alive connection idle this long."
    )

    # --- completion policies -----------------------------------------------------------------
    dispatch: Annotated[str, AfterValidator(lambda name: hold_named(name).name)] = Field(
        "adaptive", description=f"How long a request is held (the rule: {', '.join(hold_names())})."
    )
    reuse: bool = Field(True, description="Answer typed-through keystrokes from the previous completion.")
    keep_prefill: bool = Field(
        False, description="A request past its first-token deadline may finish its prefill while no one waits."
    )
    max_inflight: int = Field(1, ge=1, description="Admitted requests per session; the oldest is cancelled.")
    max_concurrency: int = Field(0, ge=0, description="Requests upstream at once (0: upstream slot count).")
    max_queue: int = Field(8, ge=0, description="Requests waiting for an upstream slot; more are refused.")
    ttft_timeout_ms: int = Field(0, ge=0, description="Deadline for the first token (0: off).")
    timeout_ms: int = Field(1500, ge=0, description="Deadline for the whole request, queue included (0: off).")

    # --- lanes: completions beside chat and agents on one server ------------------------------
    completion_reserve: int = Field(
        1, ge=0, description="Slots bulk requests (chat, agents, tools) leave to completions, where there are more."
    )
    max_bulk_queue: int = Field(16, ge=0, description="Bulk requests waiting in the proxy for a slot; more get 503.")
    bulk_wait_ms: int = Field(120000, ge=0, description="Longest a bulk request waits for a slot (0: no limit).")
    upstream_priority: bool = Field(
        False, description="The upstream orders by `priority` (vLLM --scheduling-policy priority): completions first."
    )
    slo_header: bool = Field(
        False, description="The upstream is an llm-d gateway: completions carry x-llm-d-slo-ttft-ms, their deadline."
    )

    # --- context budget ----------------------------------------------------------------------
    max_context_tokens: int = Field(2048, ge=64, description="Prompt tokens + max_tokens never exceed this.")
    max_tokens: int = Field(128, ge=1, description="Cap on the tokens a client may ask for.")
    prefix_ratio: float = Field(0.75, ge=0, le=1, description="Share of the prompt budget before the cursor.")
    context_step_lines: int = Field(16, ge=1, description="Window edges move in blocks of this many lines.")
    tokenizer: str = Field(
        "auto", description="'auto', 'upstream', 'chars', or a tokenizer.json, a .gguf or a model directory."
    )
    fim_template: str = Field(
        "mellum",
        description="mellum|starcoder|codellama|deepseek|qwen|codestral|glm|prefix|none|custom (default: checked).",
    )
    postprocess: bool = Field(
        True, description="Clean completions while they stream (suffix repeats, repeated lines, FIM markers, ...)."
    )
    stop_at_blank_line: bool = Field(
        False, description="End every completion at its first blank line, where a block ends (on with --embedded)."
    )
    default_temperature: float | None = Field(
        None, ge=0, le=5, description="Temperature sent when the client sends none (default: the server's own)."
    )

    # --- telemetry ---------------------------------------------------------------------------
    log: Path | None = Field(
        default_factory=default_log_path,
        description="Append one JSON line per request to this file (no source text); `off` for none "
        "(default: requests.jsonl in the user's state folder).",
    )
    log_max_mb: float = Field(
        64.0, gt=0, le=1024 * 1024, allow_inf_nan=False, description="Rotate the request log past this size."
    )
    log_keep: int = Field(3, ge=1, le=10_000, description="Rotated request log files kept beside the current one.")
    log_content: bool = Field(False, description="Also log prompt, suffix and completion text.")
    record: Path | None = Field(None, description="Record every incoming completion request (for bench replay).")
    vram_interval_ms: int = Field(200, ge=10, description="GPU memory sampling period.")
    gpu: int = Field(0, ge=0, description="NVML index of the GPU the upstream runs on.")
    upstream_pid: int = Field(0, ge=0, description="Upstream server's PID, for its own GPU usage (0: unknown).")

    @model_validator(mode="before")
    @classmethod
    def _embedded_defaults(cls, data: Any) -> Any:
        """With `--embedded` as the only upstream, `EMBEDDED_DEFAULTS` for what the user did not set."""
        if isinstance(data, dict) and _true(data.get("embedded")) and "upstream" not in data:
            data = {**EMBEDDED_DEFAULTS, **data}
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """`max_tokens = true` in TOML is a mistake, not 1 (pydantic's lax mode would take it as 1)."""
        if isinstance(value, bool) and info.field_name and cls.model_fields[info.field_name].annotation in NUMBERS:
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535 or has_blank_or_control(host):
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:8011")
        return value

    @field_validator("routing_key_header")
    @classmethod
    def _check_header_name(cls, value: str) -> str:
        if not is_header_name(value):
            raise ValueError(f"expected an HTTP header name (letters, digits, -_.!#$%&'*+^`|~), got {value!r}")
        return value

    @field_validator("upstream_api_key", "auth_token")
    @classmethod
    def _check_secret(cls, value: str | None) -> str | None:
        if value is not None and has_control(value):  # never echoed: it is a secret
            raise ValueError("it is sent in a header: no line break or control character (a copied newline?)")
        return value

    @field_validator("upstream_kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        """A kind the registry (`mellum_proxy.upstream.servers`) has, or `auto`."""
        if value != "auto" and value not in kind_names():
            raise ValueError(f"expected auto or one of {', '.join(kind_names())}, got '{value}'")
        return value

    @field_validator("tokenizer")
    @classmethod
    def _check_tokenizer(cls, value: str) -> str:
        if value in ("auto", "upstream", "chars"):
            return value
        path = Path(value).expanduser()
        usable = path.is_dir() or (path.is_file() and path.suffix.lower() in (".json", ".gguf"))
        if not usable:
            raise ValueError("expected auto, upstream, chars, or a path: tokenizer.json, .gguf or model directory")
        return str(path)

    @field_validator("fim_template")
    @classmethod
    def _check_template(cls, value: str) -> str:
        from mellum_proxy.budget.templates import template_for

        template_for(value)  # raises ValueError with the known names
        return value

    @field_validator("log", "record", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        """`off` (or `none`, or nothing) for a file setting: no file."""
        if isinstance(value, str) and value.strip().lower() in ("off", "none", ""):
            return None
        return Path(value).expanduser() if isinstance(value, str | Path) else value

    @field_validator("upstream", mode="before")
    @classmethod
    def _normalize_upstream(cls, value: Any) -> Any:
        value = _listed(value)
        if not isinstance(value, list | tuple):
            return value
        if not value:
            raise ValueError("expected at least one URL")
        for url in value:
            if not isinstance(url, str) or not url.strip().startswith(("http://", "https://")):
                raise ValueError("expected an http:// or https:// URL")
            if not is_server_url(url.strip()):
                raise ValueError("expected an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080")
        return tuple(upstream_base_url(url) for url in value)

    @field_validator("upstream_header", mode="before")
    @classmethod
    def _check_headers(cls, value: Any) -> Any:
        value = _listed(value)
        for item in value if isinstance(value, list | tuple) else ():
            name, sep, _ = str(item).partition("=")
            name = name.strip()
            if not sep or not name or any(c in name for c in " :\r\n"):
                raise ValueError(f"expected NAME=VALUE, got {item!r}")
            if has_control(str(item)):
                raise ValueError(f"a header may hold no line break or control character: {item!r}")
        return value

    @field_validator("developer_id")
    @classmethod
    def _check_developer_id(cls, value: str) -> str:
        if has_control(value):
            raise ValueError("it is sent as a header value: no line break or control character")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        if self.max_tokens >= self.max_context_tokens:  # the prompt needs room too
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be below max_context_tokens ({self.max_context_tokens})"
            )
        return self

    @property
    def headers(self) -> dict[str, str]:
        """`upstream_header` as a mapping."""
        pairs = (item.partition("=") for item in self.upstream_header)
        return {name.strip(): value.strip() for name, _, value in pairs}

    @property
    def dispatch_rule(self) -> str:
        """`dispatch`, except that a setting that chooses a rule (`debounce_ms`: fixed) given without it does."""
        return chosen_hold(self.dispatch, self.model_fields_set)

    def shown(self) -> dict[str, Any]:
        """The settings as `/status` shows them: no secret, no credential in a URL."""
        values = self.model_dump(mode="json")
        values["dispatch"] = self.dispatch_rule  # what is in force (`debounce_ms` alone asks for `fixed`)
        values["upstream"] = [redact_url(url) for url in self.upstream]
        values["upstream_header"] = [f"{name}=***" for name in self.headers]
        values["auth_token"] = "***" if self.auth_token else None
        values["upstream_api_key"] = "***" if self.upstream_api_key else None
        return values

    @property
    def loopback_only(self) -> bool:
        """Whether only this machine can reach the proxy."""
        host = self.listen_host
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False  # a name that may resolve beyond this machine

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Precedence, highest first: CLI (passed as init values) > environment > TOML file > defaults. The TOML
        # file is the one `load_settings` names (`toml_file` of its subclass); none without it.
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))
