"""The planner's commands: `inspect`, `sweep`, `inspect-log`, `defaults`, `doctor`, `profile`."""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from mellum_proxy.console import POSITIVE, fail, real
from mellum_proxy.planning.defaults import CANDIDATE_QUANTS, choose
from mellum_proxy.planning.inspect import InspectError, ModelInfo, bundled_shape, inspect_path, render, report
from mellum_proxy.planning.kvcache import KV_BYTES, kv_bytes
from mellum_proxy.planning.logs import compare, parse_log
from mellum_proxy.planning.shapes import ASSUMED_ARCH
from mellum_proxy.planning.sweep import SweepSpec, as_rows, best, sweep
from mellum_proxy.planning.sweep import render as render_sweep
from mellum_proxy.planning.weights import QUANT_ALIASES, bits_for
from mellum_proxy.telemetry.doctor import diagnose, read_probe
from mellum_proxy.telemetry.stats import log_to_read, read_log
from mellum_proxy.upstream.servers import kind_named, loader_names
from mellum_proxy.upstream.servers.llamacpp import LLAMACPP
from mellum_proxy.upstream.servers.vllm import VLLM


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got '{text}'") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got '{text}'")
    return values


def _bpw(text: str) -> tuple[str, float]:
    name, _, bits = text.partition("=")
    try:
        value = float(bits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected QUANT=BITS (e.g. q4=5.33), got '{text}'") from None
    if not name.strip() or not 0 < value <= 32:
        raise argparse.ArgumentTypeError(f"expected QUANT=BITS with BITS above 0 and at most 32, got '{text}'")
    return name.strip(), value


def _spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-gib", type=real(0, above=True), required=True, help="GPU memory in GiB")
    parser.add_argument("--margin", type=real(0, 0.9), default=0.25, help="headroom to keep [default: 0.25]")
    parser.add_argument(
        "--target-util", type=real(0, 1, above=True), default=0.85, help="utilization ceiling [default: 0.85]"
    )
    parser.add_argument("--kv-dtype", choices=sorted(KV_BYTES), default="f16", help="KV cache type [default: f16]")
    parser.add_argument("--backend", choices=sorted(loader_names()),
                        help="serving engine [default: llama.cpp for a .gguf, else vllm]")  # fmt: skip
    parser.add_argument(
        "--overhead-gib", type=real(0), help="runtime overhead beyond weights and KV [default: per backend]"
    )
    parser.add_argument(
        "--bpw", type=_bpw, action="append", default=[], help="bits per weight of a quant, e.g. q4=5.33"
    )


def add_commands(commands: Any) -> None:
    inspect = commands.add_parser("inspect", help="what a model directory or GGUF holds, and its KV cache cost")
    inspect.add_argument("path", type=Path)
    inspect.add_argument("--json", action="store_true")

    sweep_p = commands.add_parser("sweep", help="weights + KV + overhead over quantization x context x batch")
    source = sweep_p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="model directory or .gguf")
    source.add_argument("--total-b", type=real(0, above=True), help="total parameters in billions (no model at hand)")
    sweep_p.add_argument("--active-b", type=real(0, above=True), help="active parameters in billions (MoE; speed only)")
    sweep_p.add_argument("--arch", help="shape for --total-b: mellum-4b, mellum2.1 [default: assumed Llama-like]")
    sweep_p.add_argument("--quants", default="q4,q5,q8", help="[default: q4,q5,q8]")
    sweep_p.add_argument("--contexts", type=_ints, default=(2048, 4096, 8192, 16384, 32768))
    sweep_p.add_argument("--batches", type=_ints, default=(1, 2, 4))
    sweep_p.add_argument("--context", type=POSITIVE, help="the business context [default: the largest of --contexts]")
    sweep_p.add_argument("--csv", type=Path, help="also write every cell to this CSV")
    sweep_p.add_argument("--json", action="store_true")
    _spec_options(sweep_p)

    log = commands.add_parser("inspect-log", help="what a server's start-up log says it allocated, vs the estimate")
    log.add_argument("file", type=Path, nargs="?", help="a start-up log (or --embedded)")
    log.add_argument("--embedded", action="store_true",
                     help="start the embedded llama.cpp server (with --model, that GGUF) and read its log")  # fmt: skip
    log.add_argument("--save", type=Path, help="with --embedded: also keep the log in this file")
    log.add_argument("--model", type=Path, help="model directory or .gguf, for estimate vs measured")
    log.add_argument("--json", action="store_true")

    defaults = commands.add_parser("defaults", help="write defaults.env and print proxy and server settings")
    defaults.add_argument("--model", type=Path, required=True)
    defaults.add_argument("--context", type=POSITIVE, required=True, help="the context the work needs")
    defaults.add_argument("--stress-context", type=POSITIVE, help="[default: twice --context, within the model's]")
    defaults.add_argument("--batch", type=POSITIVE, help="concurrent sequences [default: the largest that stays OK]")
    defaults.add_argument("--out", type=Path, help="also write the variables to this file [default: print only]")
    _spec_options(defaults)

    prof = commands.add_parser("profile", help="measure a completion server: prefill, decode, slots, disconnects")
    prof.add_argument("--upstream", required=True, help="server base URL, or 'embedded' to start one and measure it")
    prof.add_argument("--name", help="the profile's name [default: kind:model]")
    prof.add_argument("--model", type=Path, help="with --upstream embedded: serve this GGUF [default: gemma-3-270m]")
    prof.add_argument("--out", type=Path, default=Path("profile.json"), help="JSON output [default: profile.json]")
    doctor = commands.add_parser("doctor", help="which knob to move first, from a request log")
    doctor.add_argument("log", type=Path, nargs="?", help="the proxy's request log [default: the one serve writes]")
    doctor.add_argument("--probe", type=Path, help="a `mellum-proxy probe --out` CSV")
    doctor.add_argument("--json", action="store_true")


def _load(path: Path) -> ModelInfo:
    try:
        return inspect_path(path)
    except (InspectError, OSError) as exc:
        fail(str(exc))


def _spec(args: argparse.Namespace, quants: tuple[str, ...], contexts: tuple[int, ...], batches: tuple[int, ...],
          business: int | None, params: float | None) -> SweepSpec:  # fmt: skip
    if not 0 <= args.margin < 1 or not 0 < args.target_util <= 1:
        fail("--margin must be in [0, 1) and --target-util in (0, 1]")
    return SweepSpec(gpu_gib=args.gpu_gib, quants=quants, contexts=contexts, batches=batches, margin=args.margin,
                     target_util=args.target_util, kv_dtype=args.kv_dtype, backend=_backend(args),
                     overhead_gib=args.overhead_gib, business_context=business, params_total=params,
                     bpw=tuple(args.bpw))  # fmt: skip


def _backend(args: argparse.Namespace) -> str:
    """`--backend`, else llama.cpp for a GGUF (what serves one) and vLLM for the rest."""
    if args.backend:
        return str(args.backend)
    model = getattr(args, "model", None)
    return LLAMACPP.name if model is not None and model.suffix.lower() == ".gguf" else VLLM.name


def _within_file(quants: tuple[str, ...], info: ModelInfo) -> tuple[tuple[str, ...], list[str]]:
    """The quantizations `info`'s files can be served at (none finer than their own: a file gains no precision
    by being served), and the note that says which were left out."""
    try:
        own = bits_for(info.precision)
    except ValueError:  # a precision the table does not know: nothing to compare with
        return quants, []
    kept = tuple(q for q in quants if bits_for(QUANT_ALIASES.get(q.lower(), q)) <= own + 1e-9)
    dropped = [q for q in quants if q not in kept]
    note = [f"{', '.join(dropped)} left out: finer than the file's own {info.precision}"] if dropped else []
    return kept or (info.precision,), note


def run_inspect(args: argparse.Namespace) -> None:
    data = report(_load(args.path))
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() if args.json else render(data))


def run_sweep(args: argparse.Namespace) -> None:
    notes: list[str] = []
    measured = None
    if args.model is not None:
        info = _load(args.model)
        shape = info.shape
        measured = (info.precision, info.weights_bytes) if info.weights_bytes else None
        params = None
    else:
        try:
            shape = bundled_shape(args.arch) if args.arch else ASSUMED_ARCH
        except InspectError as exc:
            fail(str(exc))
        params = args.total_b * 1e9
        notes.append(f"weights from --total-b {args.total_b:g} B; KV cache for the {shape.arch} shape")
    if shape.experts:
        active = args.active_b or shape.params_active / 1e9
        notes.append(f"MoE: all experts stay resident (weights follow total parameters); {active:.2f} B active "
                     "per token set the speed, not the memory")  # fmt: skip
    quants = tuple(q.strip() for q in args.quants.split(",") if q.strip())
    if args.model is not None:
        quants, left_out = _within_file(quants, info)
        notes += left_out
    # the business context is always a column: the pick and its explanation are cells at it
    contexts = tuple(sorted({*args.contexts, args.context})) if args.context else args.contexts
    spec = _spec(args, quants, contexts, args.batches, args.context, params)
    try:
        cells = sweep(shape, spec, measured)
    except ValueError as exc:
        fail(str(exc))
    pick, why = best(cells, spec)
    if args.csv is not None:
        with args.csv.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(as_rows(cells)[0]))
            writer.writeheader()
            writer.writerows(as_rows(cells))
    notes += [note for note in shape.notes if note not in notes]  # each said once, in the table and the JSON
    if args.json:
        body = {"cells": as_rows(cells), "best": as_rows([pick])[0] if pick else None, "why": why, "notes": notes}
        print(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_sweep(cells, spec, pick, why, notes))


def run_inspect_log(args: argparse.Namespace) -> None:
    if args.embedded == (args.file is not None):
        fail("inspect-log takes a log FILE or --embedded (one of them)")
    if args.embedded:
        from mellum_proxy.upstream.embedded import packaged_model, start_log

        try:
            model = args.model if args.model is not None and args.model.suffix == ".gguf" else None
            text = start_log(model)
            if args.model is None:
                args.model = packaged_model()
            if args.save is not None:
                args.save.write_text(text)
        except (RuntimeError, OSError) as exc:
            fail(f"inspect-log --embedded: {exc}")
        source = "the embedded server's log"
    else:
        try:
            text = args.file.read_text(errors="replace")
        except OSError as exc:
            fail(f"cannot read {args.file}: {exc.strerror}")
        source = str(args.file)
    found = parse_log(text)
    if found.backend is None:
        fail(f"{source}: no vLLM, llama.cpp or Ollama allocation lines found")
    result: dict[str, Any] = {"backend": found.backend, "weights_bytes": found.weights_bytes,
                              "kv_bytes": found.kv_bytes, "compute_bytes": found.compute_bytes,
                              "facts": found.facts, "evidence": found.evidence}  # fmt: skip
    if args.model is not None:
        info = _load(args.model)
        result["comparison"] = _compare(found.backend, found.facts, found.weights_bytes, found.kv_bytes, info, text)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    print(f"backend: {found.backend}")
    for name in ("weights_bytes", "kv_bytes", "compute_bytes"):
        if result[name]:
            print(f"  {name.removesuffix('_bytes'):<8} {result[name] / 2**20:10.1f} MiB")
    for key, value in found.facts.items():
        print(f"  {key}: {value}")
    for component, row in (result.get("comparison") or {}).items():
        error = "-" if row["error"] is None else f"{row['error']:+.1%}"
        print(f"  {component:<8} measured {row['measured_bytes'] / 2**20:9.1f} MiB   estimated "
              f"{row['estimated_bytes'] / 2**20:9.1f} MiB   error {error}")  # fmt: skip


def _compare(backend: str, facts: dict[str, Any], weights: int, kv: int, info: ModelInfo, text: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    if weights:
        rows["weights"] = compare(weights, info.weights_bytes)
    dtype = str(facts.get("kv_type", "f16")).lower()
    dtype = dtype if dtype in KV_BYTES else "f16"
    memory = kind_named(backend).memory
    extent = memory.kv_extent(facts, text) if memory is not None and kv else None
    if memory is not None and extent is not None:
        context, sequences = extent
        rows["kv"] = compare(kv, kv_bytes(info.shape, context, sequences, dtype, memory.window_extra_tokens))
    return rows


def run_defaults(args: argparse.Namespace) -> None:
    info = _load(args.model)
    measured = (info.precision, info.weights_bytes) if info.weights_bytes else None
    spec = _spec(args, ("q4",), (args.context,), (1,), args.context, None)
    overrides = {k: getattr(spec, k) for k in ("margin", "target_util", "kv_dtype", "backend", "overhead_gib", "bpw")}
    quants, _ = _within_file(CANDIDATE_QUANTS, info)
    chosen, why = choose(info.shape, args.gpu_gib, args.context, args.stress_context, args.batch, overrides, measured,
                         quants)  # fmt: skip
    if chosen is None:
        fail(why)
    if args.out is not None:
        try:
            args.out.write_text(chosen.env())
        except OSError as exc:
            fail(f"cannot write {args.out}: {exc.strerror}")
    print(chosen.env().rstrip())
    print(f"({f'written to {args.out}; ' if args.out else ''}{why})")
    print(chosen.flags())


def run_doctor(args: argparse.Namespace) -> None:
    try:
        path = log_to_read(args.log)
    except ValueError as exc:
        fail(str(exc))
    try:
        records, malformed = read_log(path)
        probe = read_probe(args.probe) if args.probe else (None, None)
    except (OSError, KeyError, ValueError) as exc:
        fail(f"cannot read the log or probe file: {exc}")
    result = diagnose(records, probe)
    result["malformed_lines"] = malformed
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    print(f"verdict: {result['verdict']}")
    print(f"move first: {result['knob'] or 'nothing'}")
    for line in result["evidence"]:
        print(f"  - {line}")


async def _speculating(model: Path | None, spec: str = "ngram-mod") -> dict[str, Any]:
    """The embedded server again with self-speculation: its decode, beside the profile's (`profile --upstream
    embedded`; another server's speculation is its own to switch, and `fit --spec` measures it)."""
    import asyncio

    from mellum_proxy.planning.profile import decode_with
    from mellum_proxy.upstream.embedded import EmbeddedServer

    server = EmbeddedServer(model, ctx_tokens=4096 if model is None else 8192, slots=2, spec=spec)
    url = await asyncio.to_thread(server.start)
    try:
        return await decode_with(url, spec, print)
    finally:
        await asyncio.to_thread(server.stop)


def run_profile(args: argparse.Namespace) -> None:
    import asyncio

    from mellum_proxy.planning.profile import ProfileError, profile
    from mellum_proxy.upstream.health import server_problem, unreachable_line
    from mellum_proxy.urls import upstream_base_url

    async def measure() -> Any:
        if args.upstream != "embedded":
            url = upstream_base_url(args.upstream)
            problem = await server_problem(url)
            if problem is not None:
                fail(unreachable_line(url, problem))
            return await profile(url, args.name, print)
        from mellum_proxy.upstream.embedded import EmbeddedServer

        server = EmbeddedServer(args.model, ctx_tokens=4096 if args.model is None else 8192, slots=2)  # as the
        # bench starts it: `--upstream embedded`, or `--upstream fast` for the fast model
        url = await asyncio.to_thread(server.start)
        try:
            served = "gemma-3-270m Q4_K_M" if args.model is None else args.model.name
            name = args.name or f"embedded llama.cpp ({served}, 2 slots, CPU)"
            measured = await profile(url, name, print, shown_as="embedded")
        finally:
            await asyncio.to_thread(server.stop)
        return replace(measured, speculation=await _speculating(args.model))

    try:
        measured = asyncio.run(measure())
    except (ProfileError, OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        fail(f"profile failed: {exc or type(exc).__name__}")
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(measured.as_json())
    except OSError as exc:
        fail(f"cannot write {args.out}: {exc.strerror}")
    print(f"prefill {measured.prefill_tps:.0f} tok/s, decode {measured.decode_tps:.1f} tok/s, {measured.slots} slots, "
          f"{measured.overhead_ms:.0f} ms a request and {measured.overhead_per_token_ms * 1000:.0f} µs a prompt "
          f"token, {measured.idle_slowdown:.2f}x after a pause (varying by {measured.spread:.2f}); "
          f"disconnect stops decoding: {measured.disconnect_stops_decode}, "
          f"stops a prefill: {measured.disconnect_stops_prefill}; took {measured.took_s:.0f} s")  # fmt: skip
    print(f"saved {args.out} (bench lab --profile {args.out})")


HANDLERS = {"inspect": run_inspect, "sweep": run_sweep, "inspect-log": run_inspect_log, "defaults": run_defaults,
            "doctor": run_doctor, "profile": run_profile}  # fmt: skip
