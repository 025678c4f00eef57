"""Token counting for the context budget, four ways behind one interface.

- `HfTokenizer`: a `tokenizer.json` through the Hugging Face `tokenizers` library (exact, local).
- `GgufTokenizer`: the served GGUF's own vocabulary, rebuilt as a `tokenizers` tokenizer (exact, local).
- `UpstreamTokenizer`: the server's own `/tokenize` with each token's text (llama.cpp's `with_pieces`,
  vLLM's `return_token_strs`; exact, one round trip per call).
- `CountingTokenizer`: a server's `/tokenize` that counts but cannot say where its tokens start (vLLM
  without token strings, older llama.cpp): the prompt is measured exactly and cut by a calibrated
  estimate, measured again until it fits (`upstream-count`).
- `CharsEstimator`: characters per token, calibrated from the `usage.prompt_tokens` the upstream
  reports, with a safety margin (an estimate; the record says so).

`offsets(text)` gives the character offset where each token of `text` starts (no special tokens
added): the budget counts tokens per line from it with one call. `count(prompt)` is what the server
will count for a whole prompt (special tokens parsed, BOS added); `measure(prompt)` is that count and
the prompt's token offsets from one call, so the count that proves a prompt fits also teaches the
budget the token count of each of its lines. `exact` says the offsets are exact; `exact_count` that the
counts are (the budget then shrinks a prompt until the server's own count fits); `round_trip` that each call is
a request to the server (the budget then measures once a completion).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections import deque
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

from mellum_proxy.errors import UpstreamError, UpstreamProtocolError
from mellum_proxy.upstream.servers import tokenize_shapes
from mellum_proxy.upstream.servers.base import TokenizeShape

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
    exact_count: bool
    round_trip: bool

    async def offsets(self, text: str) -> list[int]: ...

    async def count(self, prompt: str) -> int: ...

    async def measure(self, prompt: str) -> tuple[int, list[int]]: ...

    def observe(self, prompt: str, prompt_tokens: int) -> None: ...


class HfTokenizer:
    method = "tokenizer.json"
    exact = True
    exact_count = True
    round_trip = False

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
        ids: list[int] = self._tokenizer.encode(prompt, add_special_tokens=True).ids
        return ids

    async def measure(self, prompt: str) -> tuple[int, list[int]]:
        offsets = await self.offsets(prompt)
        return len(offsets) + self._added, offsets

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        return None


class GgufTokenizer(HfTokenizer):
    """The GGUF model file's own vocabulary (`mellum_proxy.budget.gguf_vocab`), as llama.cpp tokenizes it."""

    method = "gguf"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer=tokenizer)


class UpstreamTokenizer:
    """The server's `POST /tokenize`, in the shape its kind takes (`servers.TokenizeShape`: llama.cpp's `content`
    and `with_pieces`, vLLM's `prompt` and `return_token_strs`)."""

    method = "upstream"
    exact = True
    exact_count = True
    round_trip = True

    def __init__(self, server: Tokenize, shape: TokenizeShape | None = None, model: str | None = None) -> None:
        self.server = server
        self.shape = shape or tokenize_shapes()[0]
        self.model = model
        self._added: int | None = None  # tokens the server adds to a prompt (BOS), asked once

    async def _tokenize(self, text: str, special: bool, pieces: bool) -> Any:
        return await self.server.tokenize(self.shape.body(text, special, pieces, self.model))

    async def offsets(self, text: str) -> list[int]:
        """Raises `NoPiecesError` when the server gives ids without their text (`with_pieces` unsupported)."""
        answer = await self._tokenize(text, special=False, pieces=True)
        if not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
            raise UpstreamProtocolError("upstream /tokenize answered without a token list")
        pieces = self.shape.pieces(answer, text)
        if self.shape.vocabulary:
            lengths = _vocab_byte_lengths(pieces, text)
            if lengths is None or sum(lengths) != len(text.encode()):
                raise NoPiecesError("upstream /tokenize answers a count without its tokens' text")
            return _char_offsets(text, lengths)
        if pieces is None:
            raise NoPiecesError("upstream /tokenize answers token ids without their pieces (no `with_pieces`)")
        return _char_offsets(text, [len(p.encode()) if isinstance(p, str) else len(p) for p in pieces])

    async def count(self, prompt: str) -> int:
        return len(await self.ids(prompt))

    async def ids(self, prompt: str) -> list[int]:
        """The ids the server sees for a prompt (special tokens parsed, BOS added)."""
        return self.shape.ids(await self._tokenize(prompt, special=True, pieces=False))

    async def ready(self) -> None:
        """Ask once what the server adds to a prompt (BOS): done where the tokenizer is chosen, not on a keystroke."""
        if self._added is None:
            self._added = await self.count("")

    async def measure(self, prompt: str) -> tuple[int, list[int]]:
        await self.ready()
        offsets = await self.offsets(prompt)
        assert self._added is not None
        return len(offsets) + self._added, offsets

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        return None


class CountingTokenizer:
    """A server's `/tokenize` that counts exactly but cannot say where its tokens start (vLLM without token
    strings, older llama.cpp builds). Lines are cut by a character estimate calibrated from every count;
    each rendered prompt is counted by the server, and the budget shrinks it until that count fits."""

    method = "upstream-count"
    exact = False
    exact_count = True
    round_trip = True

    def __init__(self, server: UpstreamTokenizer) -> None:
        self.server = server
        self.estimate = CharsEstimator()

    async def offsets(self, text: str) -> list[int]:
        return await self.estimate.offsets(text)

    async def count(self, prompt: str) -> int:
        tokens = await self.server.count(prompt)
        self.estimate.observe(prompt, tokens)
        return tokens

    async def measure(self, prompt: str) -> tuple[int, list[int]]:
        return await self.count(prompt), await self.estimate.offsets(prompt)

    async def ids(self, prompt: str) -> list[int]:
        return await self.server.ids(prompt)

    def observe(self, prompt: str, prompt_tokens: int) -> None:
        self.estimate.observe(prompt, prompt_tokens)


PROBE_TEXT = "def f(x):\n    return x  # ✓\n"


async def upstream_counter(server: Tokenize, model: str | None = None) -> UpstreamTokenizer | CountingTokenizer | None:
    """The best counter the server's `/tokenize` offers: with each token's text (exact cuts), else a count
    (exact measurement), else None (no `/tokenize`: Ollama, routers). Says once which, and why.

    Raises nothing: a server without `/tokenize` is simply not usable for it.
    """
    why = ""
    for shape in tokenize_shapes():
        tokenizer = UpstreamTokenizer(server, shape, model)
        try:
            await tokenizer.offsets(PROBE_TEXT)
            await tokenizer.ready()
            return tokenizer
        except NoPiecesError as exc:
            try:
                await tokenizer.count(PROBE_TEXT)
            except UpstreamError:
                continue
            log.info("tokenizer: %s; counting each prompt with it and cutting by a calibrated estimate", exc)
            return CountingTokenizer(tokenizer)
        except UpstreamError as exc:  # llama.cpp's body to vLLM: 400 (it takes `prompt`); Ollama: 404
            why = f"{exc.type}, HTTP {exc.upstream_status}"  # never its message: it may quote the text sent
    log.info("tokenizer: the upstream has no /tokenize the proxy can use (%s); estimating from characters", why)
    return None


_SPACE_MARK = "\u2581"  # SentencePiece's `▁`
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character each byte is written as in a vocabulary (`Ġ` = space)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shown, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            shown[chr(byte)] = byte
        else:
            shown[chr(256 + extra)] = byte
            extra += 1
    return shown


def _vocab_byte_lengths(tokens: Any, text: str = "") -> list[int] | None:
    """Each vocabulary token's length in UTF-8 bytes of `text`, from vLLM's `token_strs` (a byte-level BPE
    vocabulary's `Ġdef`, or a SentencePiece one's `▁def` and `<0x0A>`); None when they cannot be read.

    A SentencePiece `▁` stands for a space, except where the text itself has one (DeepSeek's FIM markers do:
    `<｜fim▁begin｜>`): each token is read the way the text at its place agrees with."""  # noqa: RUF002
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    alphabet = _byte_level_alphabet()
    if all(ch in alphabet for token in tokens for ch in token):
        return [len(token) for token in tokens]  # one alphabet character per byte
    raw, at, lengths = text.encode(), 0, []
    mark = _SPACE_MARK.encode()
    for token in tokens:
        if _BYTE_PIECE.fullmatch(token):
            length = 1
        else:
            length = 0
            for char in token:
                if char == _SPACE_MARK and raw.startswith(mark, at + length):  # the text's own `▁`
                    length += len(mark)
                else:
                    length += 1 if char == _SPACE_MARK else len(char.encode())
        lengths.append(length)
        at += length
    return lengths


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
    offsets: list[int] = []
    chars = seen = 0  # characters begun in data[:seen]
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
    exact_count = False
    round_trip = False

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
