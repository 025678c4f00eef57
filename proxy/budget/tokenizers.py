"""Token counting for the context budget, four ways behind one interface.

- `HfTokenizer`: a `tokenizer.json` through the Hugging Face `tokenizers` library (exact, local).
- `GgufTokenizer`: the served GGUF's own vocabulary, rebuilt as a `tokenizers` tokenizer (exact, local).
- `UpstreamTokenizer`: the server's own `/tokenize` (llama.cpp; exact, one round trip per call).
- `CharsEstimator`: characters per token, calibrated from the `usage.prompt_tokens` the upstream
  reports, with a safety margin (an estimate; the record says so).

`offsets(text)` gives the character offset where each token of `text` starts (no special tokens
added): the budget counts tokens per line from it with one call. `count(prompt)` is what the server
will count for a whole prompt (special tokens parsed, BOS added); `measure(prompt)` is that count and
the prompt's token offsets from one call, so the count that proves a prompt fits also teaches the
budget the token count of each of its lines.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

from proxy.errors import UpstreamError, UpstreamProtocolError

log = logging.getLogger("mellum_proxy")


class NoPiecesError(UpstreamProtocolError):
    """The server's `/tokenize` counts, but cannot say where its tokens start (vLLM, older llama.cpp):
    the budget cannot cut by it, and counts with another method instead."""


class Tokenize(Protocol):
    """The one thing the budget needs from a model server: its `/tokenize` (llama.cpp's body)."""

    async def tokenize(self, body: dict[str, Any]) -> Any: ...


class TokenCounter(Protocol):
    method: str
    exact: bool

    async def offsets(self, text: str) -> list[int]: ...

    async def count(self, prompt: str) -> int: ...

    async def measure(self, prompt: str) -> tuple[int, list[int]]: ...

    def observe(self, prompt: str, prompt_tokens: int) -> None: ...


class HfTokenizer:
    method = "tokenizer.json"
    exact = True

    def __init__(self, path: Path | None = None, tokenizer: Any = None) -> None:
        from tokenizers import Tokenizer

        if tokenizer is None:
            try:
                tokenizer = Tokenizer.from_file(str(path))
            except Exception as exc:  # the library raises plain Exceptions for unreadable files
                raise ValueError(f"cannot load tokenizer {path}: {exc}") from exc
        self._tokenizer = tokenizer
        self._added = tokenizer.num_special_tokens_to_add(False)  # BOS (and EOS) the server adds

    async def offsets(self, text: str) -> list[int]:
        return [start for start, _ in self._tokenizer.encode(text, add_special_tokens=False).offsets]

    async def count(self, prompt: str) -> int:
        return len(self.ids(prompt))

    def ids(self, prompt: str) -> list[int]:
        """The token ids the server would see for `prompt` (special tokens parsed, BOS added)."""
        return self._tokenizer.encode(prompt, add_special_tokens=True).ids

    async def measure(self, prompt: str) -> tuple[int, list[int]]:
        offsets = await self.offsets(prompt)
        return len(offsets) + self._added, offsets

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        return None


class GgufTokenizer(HfTokenizer):
    """The GGUF model file's own vocabulary (`proxy.budget.gguf_vocab`), as llama.cpp tokenizes it."""

    method = "gguf"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer=tokenizer)


class UpstreamTokenizer:
    """llama.cpp `POST /tokenize` (`with_pieces` for offsets, `add_special` for the prompt count)."""

    method = "upstream"
    exact = True

    def __init__(self, server: Tokenize) -> None:
        self.server = server
        self._added: int | None = None  # tokens the server adds to a prompt (BOS), asked once

    async def offsets(self, text: str) -> list[int]:
        """Raises `NoPiecesError` when the server gives ids without their text (`with_pieces` unsupported)."""
        body = await self.server.tokenize({"content": text, "with_pieces": True})
        pieces = [token.get("piece") for token in _tokens(body)]
        if not all(isinstance(piece, str | list) for piece in pieces):
            raise NoPiecesError("upstream /tokenize answers token ids without their pieces (no `with_pieces`)")
        return _char_offsets(text, [len(p.encode()) if isinstance(p, str) else len(p) for p in pieces])

    async def count(self, prompt: str) -> int:
        body = await self.server.tokenize({"content": prompt, "add_special": True})
        return len(_tokens(body))

    async def measure(self, prompt: str) -> tuple[int, list[int]]:
        if self._added is None:
            self._added = await self.count("")
        offsets = await self.offsets(prompt)
        return len(offsets) + self._added, offsets

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        return None


async def upstream_tokenizer_usable(tokenizer: UpstreamTokenizer) -> bool:
    """Whether the server's `/tokenize` can cut prompts (it answers, and with pieces); says once why not.

    Raises nothing: a server without `/tokenize` is simply not usable for it.
    """
    try:
        await tokenizer.offsets("def f(x):\n")
    except NoPiecesError as exc:
        log.info("tokenizer: %s; estimating from characters instead", exc)
        return False
    except UpstreamError as exc:  # vLLM's takes `prompt` (400), Ollama has none (404)
        log.info("tokenizer: the upstream's /tokenize cannot cut prompts (%s); estimating from characters",
                 exc.message)  # fmt: skip
        return False
    return True


def _tokens(body: Any) -> list[Any]:
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list):
        raise UpstreamProtocolError("upstream /tokenize answered without a token list")
    return [t if isinstance(t, dict) else {"id": t} for t in tokens]


_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 bytes that do not start a character


def _char_offsets(text: str, byte_lengths: list[int]) -> list[int]:
    """Token start offsets in characters from token lengths in UTF-8 bytes.

    A token that starts inside a multi-byte character is moved to the next character start, so a cut
    at a token boundary never splits a character.
    """
    starts = [0, *accumulate(byte_lengths)][:-1]
    if text.isascii():
        return [start for start in starts if start < len(text)]
    data = text.encode()
    offsets, chars, seen = [], 0, 0  # characters begun in data[:seen]
    for start in starts:
        chars += len(data[seen:start].translate(None, _CONTINUATION))
        seen = start
        if chars < len(text) and (not offsets or chars > offsets[-1]):
            offsets.append(chars)
    return offsets


MAX_CHARS_PER_TOKEN = 8.0  # no tokenizer packs source code denser; a higher ratio is a partial count


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
        self._quantile: float | None = None  # the percentile of `_ratios`, sorted again only after a change

    @property
    def chars_per_token(self) -> float:
        if not self._ratios:
            return self.initial
        if self._quantile is None:
            ordered = sorted(self._ratios)
            self._quantile = ordered[int(self.quantile * (len(ordered) - 1))]
        return self._quantile

    def _step(self) -> float:
        return max(0.5, self.chars_per_token / (1 + self.margin))

    async def offsets(self, text: str) -> list[int]:
        step = self._step()
        return [int(i * step) for i in range(math.ceil(len(text) / step))]

    async def count(self, prompt: str) -> int:
        return math.ceil(len(prompt) / self._step()) + 1  # + BOS

    async def measure(self, prompt: str) -> tuple[int, list[int]]:
        return await self.count(prompt), await self.offsets(prompt)

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        if prompt_tokens <= 0 or len(prompt) < 64:  # tiny prompts are dominated by special tokens
            return
        if len(prompt) / prompt_tokens <= MAX_CHARS_PER_TOKEN:  # more: a count of the uncached part only (Ollama)
            self._ratios.append(len(prompt) / prompt_tokens)
            self._quantile = None
