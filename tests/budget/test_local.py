"""Finding the served model's own tokenizer: a model directory, a tokenizer.json, a GGUF, or nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from mellum_proxy.budget.gguf_vocab import UnsupportedVocabulary
from mellum_proxy.budget.local import find_local, load_local, served_model_path
from mellum_proxy.errors import UpstreamStatusError


class Server:
    """An upstream that names `root` in `/v1/models` (vLLM) and tokenizes with `ids` (or fails)."""

    def __init__(self, root: str, ids: Any = None) -> None:
        self.root, self.ids = root, ids

    async def get_json(self, path: str) -> Any:
        if path == "/props":
            raise UpstreamStatusError(404, "not found")
        return {"data": [{"id": "mellum", "root": self.root}]}

    async def tokenize(self, body: dict[str, Any]) -> Any:
        return {"tokens": self.ids(body["content"])}


def test_a_model_directory_or_a_tokenizer_json(bpe_tokenizer: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(UnsupportedVocabulary, match=r"no tokenizer\.json"):
        load_local(model)
    shutil.copy(bpe_tokenizer, model / "tokenizer.json")
    assert load_local(model).ids("def f():") == load_local(bpe_tokenizer).ids("def f():")
    assert load_local(model / "tokenizer.json").method == "tokenizer.json"
    (tmp_path / "weights.gguf").write_bytes(b"not a gguf")
    with pytest.raises(UnsupportedVocabulary, match="cannot read"):
        load_local(tmp_path / "weights.gguf")


async def test_the_served_path_is_used_only_when_it_agrees_with_the_server(bpe_tokenizer: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(bpe_tokenizer, model / "tokenizer.json")
    local = load_local(model)
    assert await served_model_path(Server(str(model))) == model
    assert await served_model_path(Server("/no/such/model")) is None
    agreeing = Server(str(model), ids=local.ids)
    assert await find_local(agreeing, None) is not None
    off_by_one = Server(str(model), ids=lambda text: [*local.ids(text), 0])
    assert await find_local(off_by_one, None) is None  # a different tokenizer: keep asking the server
