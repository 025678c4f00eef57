"""Is the cursor inside a comment or a string? Decided by a real lexer (Pygments).

The lexer is chosen from the file name, else the request's language; unknown means "allowed"
(None). Only the last `window` characters before the cursor are lexed, so a block comment opened
earlier than that is not seen.
"""

from __future__ import annotations

from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.token import Comment, String, _TokenType
from pygments.util import ClassNotFound

WINDOW_CHARS = 8000


@lru_cache(maxsize=64)
def _lexer(filename: str | None, language: str | None) -> Lexer | None:
    options = {"stripnl": False, "ensurenl": False}  # keep offsets equal to the text's
    try:
        if filename:
            return get_lexer_for_filename(filename, **options)
    except ClassNotFound:
        pass
    try:
        if language:
            return get_lexer_by_name(language.lower(), **options)
    except ClassNotFound:
        pass
    return None


def _is_comment_or_string(kind: _TokenType) -> bool:
    return kind in Comment or kind in String


def cursor_in_comment_or_string(
    prefix: str, suffix: str, filename: str | None, language: str | None = None
) -> bool | None:
    """True inside a comment or string, False outside, None when the language is unknown."""
    lexer = _lexer(filename, language)
    if lexer is None:
        return None
    before = prefix[-WINDOW_CHARS:]
    if not before:
        return False
    text = before + suffix.split("\n", 1)[0] + "\n"
    cursor = len(before)
    tokens = list(lexer.get_tokens_unprocessed(text))
    for i, (start, kind, value) in enumerate(tokens):
        end = start + len(value)
        if not start < cursor <= end:
            continue  # find the token holding the character just before the cursor
        if not _is_comment_or_string(kind):
            return False
        if end > cursor or kind in Comment.Single or kind in Comment.Hashbang:
            return True  # strictly inside, or at the end of a line comment (it runs to the newline)
        # the token ends at the cursor: inside only if the same string or comment goes on after it
        following = tokens[i + 1][1] if i + 1 < len(tokens) else None
        return following is not None and (following in String if kind in String else following in Comment)
    return False
