"""Token counting for the context budget, three ways behind one interface.

- `HfTokenizer`: a `tokenizer.json` through the Hugging Face `tokenizers` library (exact).
- `UpstreamTokenizer`: the server's own `/tokenize` (llama.cpp; exact for the served model).
- `CharsEstimator`: characters per token, calibrated from the `usage.prompt_tokens` the upstream
  reports, with a safety margin (an estimate; the record says so).

`offsets(text)` gives the character offset where each token of `text` starts (no special tokens
added): the budget counts tokens per line from it with one call. `count(prompt)` is what the server
will count for a whole prompt (special tokens parsed, BOS added).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from proxy.errors import UpstreamProtocolError


class Tokenize(Protocol):
    """The one thing the budget needs from a model server: its `/tokenize` (llama.cpp's body)."""

    async def tokenize(self, body: dict[str, Any]) -> Any: ...


class TokenCounter(Protocol):
    method: str
    exact: bool

    async def offsets(self, text: str) -> list[int]: ...

    async def count(self, prompt: str) -> int: ...

    def observe(self, prompt: str, prompt_tokens: int) -> None: ...


class HfTokenizer:
    method = "tokenizer.json"
    exact = True

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exceptions for unreadable files
            raise ValueError(f"cannot load tokenizer {path}: {exc}") from exc

    async def offsets(self, text: str) -> list[int]:
        return [start for start, _ in self._tokenizer.encode(text, add_special_tokens=False).offsets]

    async def count(self, prompt: str) -> int:
        return len(self._tokenizer.encode(prompt, add_special_tokens=True).ids)

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        return None


class UpstreamTokenizer:
    """llama.cpp `POST /tokenize` (`with_pieces` for offsets, `add_special` for the prompt count)."""

    method = "upstream"
    exact = True

    def __init__(self, server: Tokenize) -> None:
        self.server = server

    async def offsets(self, text: str) -> list[int]:
        body = await self.server.tokenize({"content": text, "with_pieces": True})
        pieces = [token.get("piece") for token in _tokens(body)]
        return _char_offsets(text, [len(p.encode()) if isinstance(p, str) else len(p or []) for p in pieces])

    async def count(self, prompt: str) -> int:
        body = await self.server.tokenize({"content": prompt, "add_special": True})
        return len(_tokens(body))

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        return None


def _tokens(body: Any) -> list[Any]:
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list):
        raise UpstreamProtocolError("upstream /tokenize answered without a token list")
    return [t if isinstance(t, dict) else {"id": t} for t in tokens]


def _char_offsets(text: str, byte_lengths: list[int]) -> list[int]:
    """Token start offsets in characters from token lengths in UTF-8 bytes.

    A token that starts inside a multi-byte character is moved to the next character start, so a cut
    at a token boundary never splits a character.
    """
    char_starts: list[int] = []  # byte offset of each character
    position = 0
    for char in text:
        char_starts.append(position)
        position += len(char.encode())
    offsets, byte_pos = [], 0
    for length in byte_lengths:
        index = bisect.bisect_left(char_starts, byte_pos)
        if index < len(text) and (not offsets or index > offsets[-1]):
            offsets.append(index)
        byte_pos += length
    return offsets


class CharsEstimator:
    """Tokens estimated from characters; calibrated from what the upstream reports.

    It keeps the last 200 observed characters-per-token ratios of real prompts and uses a low
    percentile of them (more tokens per character is the safe side), shrunk by `margin`.
    """

    method = "chars"
    exact = False

    def __init__(self, chars_per_token: float = 3.0, margin: float = 0.1, quantile: float = 0.1) -> None:
        self.initial = chars_per_token
        self.margin = margin
        self.quantile = quantile
        self._ratios: deque[float] = deque(maxlen=200)

    @property
    def chars_per_token(self) -> float:
        if not self._ratios:
            return self.initial
        ordered = sorted(self._ratios)
        return ordered[int(self.quantile * (len(ordered) - 1))]

    def _step(self) -> float:
        return max(0.5, self.chars_per_token / (1 + self.margin))

    async def offsets(self, text: str) -> list[int]:
        step = self._step()
        return [int(i * step) for i in range(math.ceil(len(text) / step))]

    async def count(self, prompt: str) -> int:
        return math.ceil(len(prompt) / self._step()) + 1  # + BOS

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        if prompt_tokens > 0 and len(prompt) >= 64:  # tiny prompts are dominated by special tokens
            self._ratios.append(len(prompt) / prompt_tokens)
