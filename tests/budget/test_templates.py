"""FIM templates render as documented and parse back."""

from __future__ import annotations

import pytest

from mellum_proxy.budget import BUILTIN, FimParts, parse_any, template_for

PARTS = FimParts(prefix="def f(x):\n    ", suffix="\n    return y\n", path="src/app.py")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mellum", "<filename>src/app.py\n<fim_suffix>\n    return y\n<fim_prefix>def f(x):\n    <fim_middle>"),
        ("starcoder", "<filename>src/app.py\n<fim_prefix>def f(x):\n    <fim_suffix>\n    return y\n<fim_middle>"),
        ("codellama", "<PRE> def f(x):\n     <SUF>\n    return y\n <MID>"),
        ("deepseek", "<｜fim▁begin｜>def f(x):\n    <｜fim▁hole｜>\n    return y\n<｜fim▁end｜>"),  # noqa: RUF001
        ("qwen", "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y\n<|fim_middle|>"),
    ],
)
def test_render_as_documented(name: str, expected: str) -> None:
    assert BUILTIN[name].render(PARTS) == expected


def test_mellum_without_a_path_leaves_the_header_out() -> None:
    rendered = BUILTIN["mellum"].render(FimParts("a", "b"))
    assert rendered == "<fim_suffix>b<fim_prefix>a<fim_middle>"
    assert BUILTIN["mellum"].stops == ("<|endoftext|>", "<filename>")


def test_braces_in_code_are_not_placeholders() -> None:
    parts = FimParts(prefix="x = '{suffix}'", suffix="{prefix}")
    assert BUILTIN["qwen"].render(parts) == "<|fim_prefix|>x = '{suffix}'<|fim_suffix|>{prefix}<|fim_middle|>"


@pytest.mark.parametrize("name", ["mellum", "starcoder", "qwen", "codellama", "deepseek"])
def test_pre_rendered_prompt_is_parsed_back(name: str) -> None:
    template, parts = parse_any(BUILTIN[name].render(PARTS))  # type: ignore[misc]
    assert template.name == name
    expected_path = PARTS.path if BUILTIN[name].header else None
    assert parts == FimParts(PARTS.prefix, PARTS.suffix, expected_path)


def test_mellum_prompt_with_other_files_keeps_them_as_context() -> None:
    prompt = "<filename>util.py\ndef g(): ...\n<filename>app.py\n<fim_suffix>S<fim_prefix>P<fim_middle>"
    _, parts = parse_any(prompt)  # type: ignore[misc]
    assert parts == FimParts("P", "S", "app.py", "<filename>util.py\ndef g(): ...\n")


def test_plain_text_is_not_a_fim_prompt() -> None:
    assert parse_any("def main():\n    print('<fim_prefix>')") is None


def test_custom_and_none_templates() -> None:
    custom = template_for("<pre>{prefix}<suf>{suffix}<mid>")
    assert custom is not None and custom.render(FimParts("a", "b")) == "<pre>a<suf>b<mid>"
    assert custom.parse("<pre>a<suf>b<mid>") == FimParts("a", "b")
    assert template_for("none") is None
    with pytest.raises(ValueError, match="known names"):
        template_for("mellum3")


def test_parsing_is_linear_in_a_prompt_of_repeated_markers() -> None:
    """A prompt of nothing but markers (the fuzzer's: 10.8 KB stalled a regex parser ~8 s, cubically):
    200 KB of it parses at once, as the body that starts at the first marker."""
    block = "<fim_suffix><fim_prefix><fim_middle>"
    prompt = block * (200_000 // len(block))
    template, parts = parse_any(prompt) or (None, None)
    mellum = BUILTIN["mellum"]
    assert template is mellum and parts is not None
    assert parts == FimParts(prefix=prompt[len("<fim_suffix><fim_prefix>") : -len("<fim_middle>")], suffix="")
    assert mellum.parse("<fim_suffix>" * 20_000) is None and mellum.parse("x" * 100_000) is None


async def test_the_template_follows_the_models_vocabulary() -> None:
    from mellum_proxy.budget.templates import PREFIX_ONLY, template_the_model_knows

    async def starcoder_vocab(marker: str) -> bool:
        return marker in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")

    async def no_fim(marker: str) -> bool:
        return False

    mellum = BUILTIN["mellum"]
    assert await template_the_model_knows(mellum, starcoder_vocab) is mellum  # same markers: kept
    assert await template_the_model_knows(BUILTIN["qwen"], starcoder_vocab) is mellum  # the first it knows
    assert await template_the_model_knows(mellum, no_fim) is PREFIX_ONLY
    assert PREFIX_ONLY.render(FimParts("def f(", ")")) == "def f("


def test_jetbrains_own_layout_names_the_edited_file() -> None:
    """JetBrains/mellum-sdk `MellumCompletionService.kt` writes the edited file's `<filename>` with no newline
    before the markers; other files before it keep theirs."""
    prompt = "<filename>utils.py\ndef g(): ...\n<filename>demo.py<fim_suffix>S<fim_prefix>P<fim_middle>"
    template, parts = parse_any(prompt)  # type: ignore[misc]
    assert template.name == "mellum"
    assert parts == FimParts("P", "S", "demo.py", "<filename>utils.py\ndef g(): ...\n")
