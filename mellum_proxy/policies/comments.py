"""A guard: no completion while the cursor is inside a comment or a string, where the user's own words, not code,
come next (`complete_in_comments = false`; on by default, as completing there is what most people want)."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from mellum_proxy.models import NormalizedRequest, Outcome
from mellum_proxy.policies.registry import Guard, GuardKind


class CommentSettings(BaseModel):
    complete_in_comments: bool = Field(True, description="Complete when the cursor is in a comment/string.")


class InCommentOrString:
    """Ends a fill-in-the-middle request whose cursor the file's lexer puts in a comment or a string (`skipped`)."""

    def __init__(self, inside: Callable[[str, str, str | None, str | None], bool | None]) -> None:
        self.inside = inside

    def stops(self, request: NormalizedRequest) -> Outcome | None:
        if request.suffix is None:
            return None
        inside = self.inside(request.prefix, request.suffix, request.file_path, request.language)
        return Outcome.SKIPPED if inside else None


def build(settings: CommentSettings) -> Guard | None:
    if settings.complete_in_comments:
        return None
    from mellum_proxy.budget.comments import cursor_in_comment_or_string  # the lexers load only where they are used

    return InCommentOrString(cursor_in_comment_or_string)


COMMENTS = GuardKind("comments", build)
