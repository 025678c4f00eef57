"""A GGUF file's own vocabulary as a Hugging Face `tokenizers.Tokenizer`, so the budget counts exactly
what llama.cpp will count without asking it.

The GGUF stores what llama.cpp tokenizes with (`tokenizer.ggml.*`): the tokens, their scores and types,
the BPE merges, the pre-tokenizer's name and whether BOS/EOS are added. Two families are rebuilt:

- `llama` (SentencePiece BPE: Gemma, Llama 2, Mistral): spaces become `▁`, the pair whose merged
  token scores highest merges first (the merges are derived from the scores), unknown characters fall
  back to `<0xXX>` byte tokens.
- `gpt2` (byte-level BPE: StarCoder, Llama 3, Qwen, Mellum): the stored merges after the pre-tokenizer
  llama.cpp uses for `tokenizer.ggml.pre`; only the names in `PRE_TOKENIZERS` are known here.

Control and user-defined tokens are matched in the raw text first, as llama.cpp's `/tokenize` and
`/completion` do. The result is checked against the server before it is trusted (`mellum_proxy.budget.choose`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPACE = "\u2581"  # SentencePiece's visible space
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

# llama.cpp `llama-vocab.cpp`: the regexes it splits text with before byte-level BPE, by `tokenizer.ggml.pre`.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,),
    "gpt-2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "smollm": (r"\p{N}", _GPT2),
    "llama3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
}


class UnsupportedVocabulary(ValueError):
    """The GGUF's tokenizer is of a kind this module does not rebuild."""


def read_vocabulary(path: Path) -> dict[str, Any]:
    """The `tokenizer.ggml.*` fields of a GGUF file (memory-mapped; the weights are not read)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise UnsupportedVocabulary(f"cannot read {path} as GGUF: {exc}") from exc
    fields: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.ggml."):
            fields[name.removeprefix("tokenizer.ggml.")] = field.contents()
    if "tokens" not in fields:
        raise UnsupportedVocabulary(f"{path} has no tokenizer vocabulary")
    return fields


def tokenizer_from_gguf(path: Path) -> Any:
    """A `tokenizers.Tokenizer` equal to llama.cpp's for the model in `path`.

    Raises:
        UnsupportedVocabulary: not a GGUF, no vocabulary, or a tokenizer family not rebuilt here.
    """
    return build_tokenizer(read_vocabulary(path))


def build_tokenizer(fields: dict[str, Any]) -> Any:
    kind = fields.get("model")
    if kind == "llama":
        tokenizer = _sentencepiece_bpe(fields)
    elif kind == "gpt2":
        tokenizer = _byte_level_bpe(fields)
    else:
        raise UnsupportedVocabulary(f"tokenizer model {kind!r} is not rebuilt locally (known: llama, gpt2)")
    _add_special_tokens(tokenizer, fields)
    _add_post_processor(tokenizer, fields)
    return tokenizer


def _sentencepiece_bpe(fields: dict[str, Any]) -> Any:
    import numpy as np  # only when a vocabulary is rebuilt: numpy is 15 MB of the proxy's memory
    from tokenizers import Tokenizer, normalizers
    from tokenizers.models import BPE

    tokens: list[str] = fields["tokens"]
    vocab = {token: i for i, token in enumerate(tokens)}
    scores = np.asarray(fields.get("scores", np.zeros(len(tokens))), dtype=np.float64)
    types = np.asarray(fields.get("token_type", np.ones(len(tokens))), dtype=np.int64)
    unk = int(fields.get("unknown_token_id", 0))
    model = BPE(
        vocab=vocab,
        merges=_merges_by_score(tokens, vocab, scores, types),
        unk_token=tokens[unk],
        fuse_unk=True,
        byte_fallback=True,
        ignore_merges=False,
    )
    tokenizer = Tokenizer(model)
    steps: list[Any] = [normalizers.Replace(" ", SPACE)]
    if fields.get("add_space_prefix", True):
        steps.insert(0, normalizers.Prepend(SPACE))
    tokenizer.normalizer = normalizers.Sequence(steps)
    return tokenizer


def _merges_by_score(tokens: list[str], vocab: dict[str, int], scores: Any, types: Any) -> list[tuple[str, str]]:
    """SentencePiece merges the adjacent pair whose joined piece scores highest; as BPE merges, that is
    every split of every normal token into two tokens, ranked by the joined token's score (ties: the
    lower ids first, as Hugging Face's own converter does)."""
    merges: list[tuple[float, int, int, str, str]] = []
    for index, piece in enumerate(tokens):
        if types[index] not in (1,) or len(piece) < 2:  # 1: normal; byte, control, user-defined never merge
            continue
        score = scores[index]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            left_id, right_id = vocab.get(left), vocab.get(right)
            if left_id is not None and right_id is not None:
                merges.append((-score, left_id, right_id, left, right))
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def _byte_level_bpe(fields: dict[str, Any]) -> Any:
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import BPE

    pre = str(fields.get("pre", "default"))
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(PRE_TOKENIZERS)
        raise UnsupportedVocabulary(f"pre-tokenizer {pre!r} is not rebuilt locally (known: {known})")
    tokens: list[str] = fields["tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in fields.get("merges", [])]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama3", "llama-bpe")))
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZERS[pre]]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    return tokenizer


def _add_special_tokens(tokenizer: Any, fields: dict[str, Any]) -> None:
    from tokenizers import AddedToken

    tokens, types = fields["tokens"], fields.get("token_type")
    if types is None:
        return
    added = [
        AddedToken(tokens[i], special=int(kind) == CONTROL, normalized=False)
        for i, kind in enumerate(types)
        if int(kind) in (CONTROL, USER_DEFINED) and tokens[i]
    ]
    tokenizer.add_tokens(added)


def _add_post_processor(tokenizer: Any, fields: dict[str, Any]) -> None:
    from tokenizers import processors

    tokens = fields["tokens"]
    single, specials = "$A", []
    if fields.get("add_bos_token", False) and "bos_token_id" in fields:
        bos = tokens[int(fields["bos_token_id"])]
        single, specials = f"{bos} {single}", [(bos, int(fields["bos_token_id"]))]
    if fields.get("add_eos_token", False) and "eos_token_id" in fields:
        eos = tokens[int(fields["eos_token_id"])]
        single, specials = f"{single} {eos}", [*specials, (eos, int(fields["eos_token_id"]))]
    tokenizer.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
