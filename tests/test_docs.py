"""The door stays small and the docs stay true: a short README, pages a reader finishes, no large file in the
tree, and a settings reference that names every setting (its lines come from `Settings` when the site is
built: `docs/hooks/settings_reference.py`)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from mellum_proxy.config import EMBEDDED_DEFAULTS, Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hook(name: str = "settings_reference") -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / "hooks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_no_docs_page_is_over_400_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for p in DOCS.rglob("*.md") if (n := len(p.read_text().splitlines())) > 400]
    assert long == []


def test_no_committed_file_over_300_kb_outside_fixtures_and_traces() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    allowed = ("tests/fixtures/", "mellum_proxy/tuning/traces/")
    large = [f for f in files if not f.startswith(allowed) and (ROOT / f).is_file()
             and (ROOT / f).stat().st_size > 300 * 1024]  # fmt: skip
    assert large == []


def test_the_settings_reference_names_every_setting_once() -> None:
    page = (DOCS / "configuration.md").read_text()
    rendered = _hook().render(page)
    for name in Settings.model_fields:
        assert f"`MELLUM_PROXY_{name.upper()}`" in rendered
    assert "`--reuse` / `--no-reuse`" in rendered  # a boolean has both flags
    assert f"(`{EMBEDDED_DEFAULTS['timeout_ms']}` with `--embedded`)" in rendered


def test_the_pages_hold_what_the_generators_write() -> None:
    """The settings' lines and the `make run` editor configs are in the Markdown itself (a reader of the files
    sees them, not only the site's): `make docs-generate` writes them, and this fails while a page differs."""
    page = (DOCS / "configuration.md").read_text()
    assert _hook().render(page) == page, "configuration.md is stale: run make docs-generate"
    editors = _hook("editor_configs")
    for path in sorted((DOCS / "editors").glob("*.md")):
        text = path.read_text()
        assert editors.render_page(text) == text, f"{path.name} is stale: run make docs-generate"
    assert "127.0.0.1:8011" in (DOCS / "editors" / "continue.md").read_text()  # the config itself, in the file


def test_a_setting_missing_from_the_reference_fails_the_build() -> None:
    hook = _hook()
    page = (DOCS / "configuration.md").read_text()
    with pytest.raises(hook.SettingsDrift, match="debounce_ms"):
        hook.render(page.replace("### `debounce_ms`", "### debounce"))
    with pytest.raises(hook.SettingsDrift, match="no_such_setting"):
        hook.render(page + "\n### `no_such_setting`\n")


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "runs" not in p.parts}
    assert {page for page in pages if page not in re.findall(r"[\w/.-]+\.md", nav)} == set()


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [name for action in actions for name in action.choices]


def test_every_command_is_on_the_commands_page() -> None:
    from benchmarks.cli import build_parser as benchmarks_parser
    from mellum_proxy.cli import build_parser
    from mellum_proxy.tuning.cli import build_parser as bench_parser

    page = (DOCS / "commands.md").read_text()
    missing = [f"mellum-proxy {name}" for name in _subcommands(build_parser()) if f"`mellum-proxy {name}" not in page]
    missing += [f"mellum-proxy bench {name}" for name in _subcommands(bench_parser())
                if f"bench {name}" not in page and f"mellum-proxy {name}" not in page]  # fmt: skip
    missing += [f"python -m benchmarks {name}" for name in _subcommands(benchmarks_parser())
                if f"`python -m benchmarks {name}" not in page]  # fmt: skip
    assert missing == []


def test_the_counts_the_docs_give_are_the_codes() -> None:
    """`tune` runs `candidates()` plus direct and the oracle: the pages that quote its output say those numbers."""
    from mellum_proxy.tuning.runners.tune import candidates

    count = len(candidates())
    for page in ("tuning.md", "getting-started.md"):
        text = (ROOT / "docs" / page).read_text()
        said = {int(n) for n in re.findall(r"accuracy 0(?:\.3)?: (\d+) policies", text)}
        assert said == {count + 2}, (page, said, count)
        for number in re.findall(r"(\d+) candidate policies|of (?:the )?(\d+) candidates", text):
            assert int(next(n for n in number if n)) == count, (page, number)


def test_a_user_commands_example_writes_into_the_readers_folder() -> None:
    """Run as written, an example must not overwrite the project's committed runs (`fit ... --out docs/...`
    did); the benches' own commands reproduce a committed figure, and say so on their measurement pages."""
    user_pages = [page for page in DOCS.rglob("*.md") if "measurements" not in page.parts]
    example = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?mellum-proxy (?!bench\b)\S+.*(?:--out|--config) docs/", re.M)
    assert [(page.name, m[0]) for page in user_pages for m in example.finditer(page.read_text())] == []


def test_the_fit_runs_deadline_in_the_prose_is_the_files() -> None:
    written = re.search(r"timeout_ms = (\d+)", (DOCS / "measurements/runs/fit/config.toml").read_text())
    said = re.findall(r"`timeout_ms = (\d+)`", (DOCS / "vram-planning.md").read_text())
    assert written is not None and said == [written[1]]
