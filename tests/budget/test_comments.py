"""Cursor in a comment or string, by a real lexer, in seven languages (positions in the fixture corpus)."""

from __future__ import annotations

import pytest

from mellum_proxy.budget import cursor_in_comment_or_string
from tests.conftest import CORPUS

# (file, text right before the cursor, inside a comment or string?)
CASES = [
    ("inventory.py", "# negative amou", True),
    ("inventory.py", 'raise ValueError("amount must', True),
    ("inventory.py", '"""Items whose name contains `text`', True),
    ("inventory.py", "self.quantity +", False),
    ("inventory.py", 'print(f"total: {stock.total()}")  # prints 14', True),  # end of a line comment
    ("inventory.py", 'print(f"total: {stock.total()}")', False),  # right after the closing quote
    ("Inventory.kt", "// linear scan is fine", True),
    ("Inventory.kt", '"inventory of ${items.size} it', True),
    ("Inventory.kt", "fun total(): Int = items.val", False),
    ("Inventory.java", "/* merge keeps the sum", True),
    ("Inventory.java", 'System.out.println("low: ', True),
    ("Inventory.java", "List<String> result = new Array", False),
    ("inventory.ts", "/* total units across", True),
    ("inventory.ts", 'name: "Blue', True),
    ("inventory.ts", "const needle = text.toLower", False),
    ("inventory.go", "// Find lists items whose name", True),
    ("inventory.go", 'fmt.Sprintf("inventory of %d', True),
    ("inventory.go", "found = append(found, it", False),
    ("inventory.rs", "/* case-insensitive substring", True),
    ("inventory.rs", 'println!("total: ', True),
    ("inventory.rs", "let needle = text.to_lower", False),
    ("inventory.cpp", "/* items below the threshold", True),
    ("inventory.cpp", 'std::cout << "total: ', True),
    ("inventory.cpp", "int sum = 0", False),
]


@pytest.mark.parametrize(("name", "before", "inside"), CASES)
def test_cursor_position(name: str, before: str, inside: bool) -> None:
    text = (CORPUS / name).read_text()
    cursor = text.index(before) + len(before)
    assert cursor_in_comment_or_string(text[:cursor], text[cursor:], name) is inside


def test_language_id_when_there_is_no_file_name() -> None:
    assert cursor_in_comment_or_string("x = 1  # note", "\n", None, "python") is True
    assert cursor_in_comment_or_string("x = 1", "\n", None, "python") is False


def test_unknown_language_is_allowed() -> None:
    assert cursor_in_comment_or_string("# hello", "", "notes.unknownext", None) is None
    assert cursor_in_comment_or_string("# hello", "", None, None) is None
