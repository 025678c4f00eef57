"""Rebuilding a GGUF vocabulary as a `tokenizers` tokenizer: the rules of both families, on tiny
vocabularies (the packaged model's own vocabulary is checked against llama.cpp in
tests/functional/test_budget.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from tokenizers.pre_tokenizers import ByteLevel

from mellum_proxy.budget.gguf_vocab import UnsupportedVocabulary, build_tokenizer

NORMAL, CONTROL, BYTE = 1, 3, 6


def spm_fields(**extra: object) -> dict[str, object]:
    tokens = ["<unk>", "<s>", "</s>", "<fim>", "▁", "a", "b", "c", "ab", "bc", "abc", "▁a"]
    scores = [0, 0, 0, 0, -1, -2, -2, -2, -5, -1, -0.5, -3]  # "bc" outscores "ab"; "abc" beats both
    types = [2, CONTROL, CONTROL, CONTROL] + [NORMAL] * 8
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    scores += [0] * 256
    types += [BYTE] * 256
    return {"model": "llama", "tokens": tokens, "scores": scores, "token_type": types, "bos_token_id": 1,
            "add_bos_token": True, "add_space_prefix": False, "unknown_token_id": 0, **extra}  # fmt: skip


def pieces(fields: Mapping[str, object], text: str, special: bool = False) -> list[str]:
    tokens: list[str] = build_tokenizer(dict(fields)).encode(text, add_special_tokens=special).tokens
    return tokens


def test_sentencepiece_merges_the_best_scoring_pair_first() -> None:
    assert pieces(spm_fields(), "abc") == ["abc"]
    assert pieces(spm_fields(), "abca") == ["abc", "a"]
    assert pieces(spm_fields(), "cab") == ["c", "ab"]


def test_sentencepiece_spaces_bos_control_tokens_and_byte_fallback() -> None:
    assert pieces(spm_fields(), " a") == ["▁a"]
    assert pieces(spm_fields(), "a<fim>b", special=True) == ["<s>", "a", "<fim>", "b"]
    assert pieces(spm_fields(), "é") == ["<0xC3>", "<0xA9>"]  # not in the vocabulary: its UTF-8 bytes
    assert pieces(spm_fields(add_space_prefix=True), "a") == ["▁a"]


def test_byte_level_bpe_uses_the_stored_merges_after_the_named_pre_tokenizer() -> None:
    alphabet = sorted(ByteLevel.alphabet())
    tokens = ["<|endoftext|>", *alphabet, "de", "def", "Ġf", "12"]
    fields = {"model": "gpt2", "pre": "starcoder", "tokens": tokens, "merges": ["d e", "de f", "Ġ f", "1 2"],
              "token_type": [CONTROL] + [NORMAL] * (len(tokens) - 1)}  # fmt: skip
    assert pieces(fields, "def f") == ["def", "Ġf"]
    assert pieces(fields, "12") == ["1", "2"]  # starcoder splits digits before BPE
    assert pieces({**fields, "pre": "gpt-2"}, "12") == ["12"]
    assert pieces(fields, "def<|endoftext|>") == ["def", "<|endoftext|>"]


def test_unknown_families_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedVocabulary, match="'bert'"):
        build_tokenizer({"model": "bert", "tokens": ["a"]})
    with pytest.raises(UnsupportedVocabulary, match="'chatglm-bpe'"):
        build_tokenizer({"model": "gpt2", "pre": "chatglm-bpe", "tokens": ["a"], "merges": []})
