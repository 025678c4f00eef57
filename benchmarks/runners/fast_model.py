"""`python -m benchmarks fast-model --out FILE.gguf`: the fast random-weight model (`bench.doubles.fast_model`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.doubles.fast_model import FastShape, write_fast_model
from mellum_proxy.console import INDEX, POSITIVE, command, fail


def add_commands(commands: Any) -> None:
    fast = command(commands, "fast-model", "write a fast random-weight llama GGUF with gemma-3's vocabulary", _run)
    fast.add_argument("--out", type=Path, required=True, help="the .gguf to write")
    for name, default in (("hidden", 64), ("layers", 4), ("heads", 4), ("kv-heads", 2), ("ffn", 256)):
        fast.add_argument(f"--{name}", type=POSITIVE, default=default, help=f"[default: {default}]")
    fast.add_argument("--seed", type=INDEX, default=0, help="of the random weights [default: 0]")


def _run(args: argparse.Namespace) -> None:
    shape = FastShape(args.hidden, args.layers, args.heads, args.kv_heads, args.ffn, seed=args.seed)
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        fail("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    try:
        write_fast_model(args.out, shape)
    except (OSError, RuntimeError) as exc:
        fail(f"cannot write {args.out}: {exc}")
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB): serve it with "
          f"`mellum-proxy serve --embedded --model {args.out}`")  # fmt: skip
