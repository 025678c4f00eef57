"""The context budget: token counting, FIM templates, truncation near the cursor, comment detection."""

from mellum_proxy.budget.comments import cursor_in_comment_or_string
from mellum_proxy.budget.context import BudgetSettings, ContextBudget
from mellum_proxy.budget.templates import BUILTIN, FimParts, FimTemplate, parse_any, template_for
from mellum_proxy.budget.tokenizers import (
    CharsEstimator,
    HfTokenizer,
    NoPiecesError,
    TokenCounter,
    Tokenize,
    UpstreamTokenizer,
)

__all__ = [
    "BUILTIN",
    "BudgetSettings",
    "CharsEstimator",
    "ContextBudget",
    "FimParts",
    "FimTemplate",
    "HfTokenizer",
    "NoPiecesError",
    "TokenCounter",
    "Tokenize",
    "UpstreamTokenizer",
    "cursor_in_comment_or_string",
    "parse_any",
    "template_for",
]
