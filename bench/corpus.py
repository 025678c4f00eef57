"""The project's own small code corpus (`bench/code/`, seven languages) and a BPE trained on it.

A real byte-level BPE `tokenizer.json`, trained offline in about a second: tests and benchmarks get an
exact tokenizer without downloading one.
"""

from __future__ import annotations

from pathlib import Path

CODE_DIR = Path(__file__).parent / "code"
SPECIAL_TOKENS = ["<bos>", "<|endoftext|>", "<filename>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                  "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<PRE>", "<SUF>", "<MID>"]  # fmt: skip


def code_files() -> list[Path]:
    return [path for path in sorted(CODE_DIR.iterdir()) if path.suffix != ".md"]


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
