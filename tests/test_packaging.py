"""What `pip install .` puts on `sys.path`: one top-level package, `mellum_proxy`, so that no other
distribution's `proxy` or `bench` (the PyPI package `proxy.py` installs `proxy/`) is overwritten."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_installs_only_mellum_proxy_at_top_level(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("mellum_proxy", "benchmarks"):  # the repository's benchmarks beside it, left out of the wheel
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", str(source),
         "--wheel-dir", str(tmp_path / "dist")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("mellum_proxy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"mellum_proxy"}
    # what the commands need at run time travels with it: the tuning engine's traces, code and simulator profiles,
    # the page, the templates
    shipped_data = ("tuning/traces/json-crdt-blog-post.json.gz", "tuning/code/inventory.py", "ui/index.html",
                    "planning/configs/mellum-4b-base/config.json", "editor/templates/continue.yaml",
                    "tuning/sim/profiles.json")  # fmt: skip
    for shipped in (f"mellum_proxy/{path}" for path in shipped_data):
        assert shipped in names
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    assert "mellum-proxy = mellum_proxy.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
