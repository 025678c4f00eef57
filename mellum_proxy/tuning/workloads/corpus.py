"""What the bench ships to type: the code corpus (`mellum_proxy/tuning/code/`, seven languages), the editing traces
(`mellum_proxy/tuning/traces/`), and a BPE trained on the corpus.

A real byte-level BPE `tokenizer.json`, trained offline in about a second: tests and benchmarks get an
exact tokenizer without downloading one.
"""

from __future__ import annotations

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
CODE_DIR = BENCH_DIR / "code"
TRACES_DIR = BENCH_DIR / "traces"
SPECIAL_TOKENS = ["<bos>", "<|endoftext|>", "<filename>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                  "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<PRE>", "<SUF>", "<MID>"]  # fmt: skip


def code_files() -> list[Path]:
    return [path for path in sorted(CODE_DIR.iterdir()) if path.suffix != ".md"]


def shipped_traces() -> list[Path]:
    return sorted(TRACES_DIR.glob("*.json.gz"))


def code_texts() -> list[str]:
    return [path.read_text() for path in code_files()]


def train_bpe(path: Path, vocab_size: int = 600) -> Path:
    """Train a byte-level BPE on the corpus (BOS added like a real model's) and save it to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(code_texts(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tokenizer.save(str(path))
    return path
