"""`mellum-proxy fit`: the paper's few candidates, each measured on the real server, the defaults written."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from mellum_proxy.console import INDEX, POSITIVE, fail, real, whole
from mellum_proxy.planning.candidates import Candidate, choose_candidates
from mellum_proxy.planning.choice import Choice, choose, quality_floor
from mellum_proxy.planning.cli import _ints
from mellum_proxy.planning.fit_report import as_json, config_toml, plot, render
from mellum_proxy.planning.inspect import InspectError, ModelInfo, inspect_path
from mellum_proxy.planning.kvcache import KV_BYTES
from mellum_proxy.planning.measure import FitOptions, Measurement, measure
from mellum_proxy.planning.memory import MemoryWatch
from mellum_proxy.planning.quality import Quality, from_file, humaneval
from mellum_proxy.planning.sweep import SweepSpec, overhead_gib
from mellum_proxy.upstream.embedded import SPEC_TYPES, checked_spec
from mellum_proxy.upstream.servers import KINDS, loader_names
from mellum_proxy.upstream.servers.llamacpp import LLAMACPP


def _names(known: tuple[str, ...] | dict[str, Any], what: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse `type`: a comma-separated list of `known` names (`what` says what they are)."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in text.split(",") if part.strip())
        if not names or any(name not in known for name in names):
            raise argparse.ArgumentTypeError(f"expected {what} from {', '.join(known)}, got '{text}'")
        return names

    return parse


def _specs(text: str) -> tuple[str, ...]:
    """`--spec`: a comma-separated list of speculations (`checked_spec`)."""
    try:
        specs = tuple(checked_spec(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not specs:
        raise argparse.ArgumentTypeError(f"expected speculation types, got '{text}'")
    return specs


def add_commands(commands: Any) -> None:
    fit = commands.add_parser("fit", help="measure the paper's candidates on the real server; write the defaults")
    server = fit.add_mutually_exclusive_group(required=True)
    server.add_argument("--embedded", action="store_true", help="the embedded llama.cpp (any GGUF through --model)")
    server.add_argument("--server-cmd", help="the command that starts your server, with {model} {context} "
                        "{ctx_total} {batch} {kv} {vllm_kv} {port} {spec} {cache_reuse} {spec_flags} filled per "
                        "candidate")  # fmt: skip
    fit.add_argument("--model", type=Path, action="append", default=[],
                     help="a model file (GGUF) or directory; again for another quantization "
                          "[default with --embedded: the packaged gemma-3-270m]")  # fmt: skip
    fit.add_argument("--gpu-gib", type=real(0, above=True), required=True, help="the memory budget in GiB")
    fit.add_argument("--context", type=POSITIVE, required=True, help="the context the work needs (tokens a request)")
    fit.add_argument("--contexts", type=_ints, help="contexts to weigh [default: --context and twice it]")
    fit.add_argument("--batches", type=_ints, default=(1, 2, 4), help="batches to weigh [default: 1,2,4]")
    fit.add_argument(
        "--kv-types",
        type=_names(KV_BYTES, "KV cache types"),
        default=("f16",),
        help="KV cache types to weigh [default: f16]",
    )
    fit.add_argument("--candidates", type=POSITIVE, default=3, help="how many to measure [default: 3]")
    fit.add_argument("--margin", type=real(0, 0.9), default=0.25, help="headroom to keep [default: 0.25]")
    fit.add_argument("--target-util", type=real(0, 1, above=True), default=0.85, help="[default: 0.85]")
    fit.add_argument("--backend", choices=sorted(loader_names()),
                     help="the paper's overhead [default: llama.cpp, vllm when --server-cmd runs vllm]")  # fmt: skip
    fit.add_argument("--overhead-gib", type=real(0), help="the paper's runtime overhead [default: per backend]")
    fit.add_argument("--quality", type=Path, help='JSONL of {"prefix","suffix","expected"} [default: HumanEval]')
    fit.add_argument("--quality-tasks", type=whole(0), default=20, help="spot-check tasks, 0: none [default: 20]")
    fit.add_argument("--quality-floor", type=real(0, 1), help="exact-match rate to keep [default: best less 10 points]")
    fit.add_argument("--template", default="auto", help="FIM template for the spot check [default: the model's own]")
    fit.add_argument("--idle-s", type=real(0), default=2.0, help="idle before the first request [default: 2]")
    fit.add_argument("--load-timeout-s", type=real(1), default=300.0, help="[default: 300]")
    fit.add_argument("--request-timeout-s", type=real(1), default=180.0, help="[default: 180]")
    fit.add_argument("--threads", type=POSITIVE, default=1, help="embedded server's CPU threads [default: 1]")
    fit.add_argument("--gpu", type=INDEX, default=0, help="NVML device index [default: 0]")
    fit.add_argument("--trace", type=Path, action="append", default=[],
                     help="then the editor side: your typing (a trace, `serve --record` file or request log), "
                          "replayed by `tune` on the chosen server's profile; again for another")  # fmt: skip
    fit.add_argument("--limit-events", type=POSITIVE, default=1500, help="edits of each --trace [default: 1500]")
    fit.add_argument("--spec", type=_specs, default=(),
                     help=f"then the speed candidates: speculation to measure on your typing at the chosen context "
                          f"and batch ({', '.join(SPEC_TYPES)}, draft:FILE), e.g. none,ngram-simple,ngram-mod (the "
                          f"first --trace, or the shipped one)")  # fmt: skip
    fit.add_argument("--cache-reuse", type=_ints, default=(),
                     help="and KV shifting to measure (llama.cpp --cache-reuse N), e.g. 0,256")  # fmt: skip
    fit.add_argument("--out", type=Path, required=True, help="where defaults.env, config.toml and fit.* go")


def _models(args: argparse.Namespace) -> list[ModelInfo]:
    paths = list(args.model)
    if not paths:
        if not args.embedded:
            fail("fit --server-cmd needs --model: the files the command serves, for the paper's estimate")
        from mellum_proxy.upstream.embedded import packaged_model

        try:
            paths = [packaged_model()]
        except RuntimeError as exc:
            fail(str(exc))
    infos = []
    for path in paths:
        if args.embedded and path.suffix.lower() != ".gguf":
            fail(f"fit --embedded serves GGUF files; {path} is not one")
        try:
            infos.append(inspect_path(path))
        except (InspectError, OSError) as exc:
            fail(str(exc))
    return infos


def _quality(args: argparse.Namespace) -> Quality | None:
    if args.quality_tasks <= 0:
        return None
    try:
        chosen = from_file(args.quality, args.quality_tasks) if args.quality else humaneval(args.quality_tasks)
    except (RuntimeError, ValueError, OSError) as exc:
        fail(str(exc))
    return Quality(chosen.tasks, chosen.source, args.template)


def _kind_started_by(command: str | None) -> str:
    """The server kind a `--server-cmd` starts (a word of its `Memory.command_words` in it); llama.cpp, as the
    embedded server is, where none says."""
    for kind in KINDS:
        if command and kind.memory is not None and any(word in command for word in kind.memory.command_words):
            return kind.name
    return LLAMACPP.name


def run_fit(args: argparse.Namespace) -> None:
    infos = _models(args)
    backend = args.backend or _kind_started_by(args.server_cmd)
    contexts = tuple(sorted(set(args.contexts or (args.context, 2 * args.context))))
    if max(contexts) < args.context:
        fail(f"--contexts must reach the business context {args.context}")
    for info in infos:
        print(
            f"loaded: {info.path.name}: {info.precision}, {info.shape.params_total / 1e9:.2f} B parameters, "
            f"{info.weights_bytes / 2**30:.2f} GiB of weights, trained to {info.shape.max_context} tokens"
        )
    watch = MemoryWatch(args.gpu)
    budget = args.gpu_gib
    if watch.source == "nvml":
        print(f"budget: {args.gpu_gib:g} GiB, less {watch.before_mib / 1024:.2f} GiB in use before the server starts")
    else:
        print(f"budget: {args.gpu_gib:g} GiB, taken as given ({watch.note})")
    watch.close()
    spec = SweepSpec(gpu_gib=budget, quants=(), contexts=contexts, batches=args.batches, margin=args.margin,
                     target_util=args.target_util, backend=backend, overhead_gib=args.overhead_gib,
                     business_context=args.context)  # fmt: skip
    chosen, why = choose_candidates(infos, args.kv_types, spec, args.candidates)
    if not chosen:
        fail(f"fit: {why}")
    print(f"candidates: {why}")
    options = FitOptions(server_cmd=args.server_cmd, threads=args.threads, gpu=args.gpu, idle_s=args.idle_s,
                         load_timeout_s=args.load_timeout_s, request_timeout_s=args.request_timeout_s,
                         quality=_quality(args))  # fmt: skip
    measured: list[Measurement] = []
    interrupted = False
    try:
        asyncio.run(_measure_all(chosen, spec, options, measured))
    except KeyboardInterrupt:
        interrupted = True
        print("fit: interrupted; the server it started is stopped, what was measured is kept", file=sys.stderr)
    except ValueError as exc:  # a --server-cmd placeholder fit does not fill
        fail(str(exc))
    floor = quality_floor(measured, args.quality_floor)
    choice, because = choose(measured, args.context, floor)
    partial = f"interrupted after {len(measured)} of {len(chosen)} candidates" if interrupted else None
    speed = None
    if choice is not None and not interrupted and (args.spec or args.cache_reuse):
        speed, choice, partial = _speed(args, choice, options)
        interrupted = partial is not None
    _write(args, spec, measured, choice, because, floor, partial, server=_server_name(args, infos), speed=speed)
    if choice is not None and args.trace and not interrupted and _editor_side(args, choice, options):
        _mark_partial(args.out, "interrupted in the editor side (profile and tune); the server side is complete")
        interrupted = True
    if interrupted:
        sys.exit(130)
    if choice is None:
        print(f"fit: {because}", file=sys.stderr)
        sys.exit(1)


async def _measure_all(chosen: list[Candidate], spec: SweepSpec, options: FitOptions,
                       measured: list[Measurement]) -> None:  # fmt: skip
    for number, candidate in enumerate(chosen, 1):
        print(f"[{number}/{len(chosen)}] {candidate.name} ({candidate.why}): paper "
              f"{candidate.paper.total_bytes / 2**30:.2f} GiB {candidate.paper.label}", flush=True)  # fmt: skip
        result = await measure(candidate, spec.gpu_gib, spec.margin, spec.target_util, options,
                               lambda text: print(text, flush=True))  # fmt: skip
        measured.append(result)
        peak = "-" if result.measured_peak_gib is None else f"{result.measured_peak_gib:.2f} GiB"
        print(f"  {result.status}: peak {peak} ({result.memory_source}), took {result.took_s:.0f} s", flush=True)


def _speed(args: argparse.Namespace, choice: Choice, options: FitOptions) -> tuple[dict[str, Any], Choice, str | None]:
    """The speed candidates at the chosen memory candidate (`mellum_proxy.planning.speed`): their report, the choice
    with their knobs, and what interrupted them, if anything."""
    from mellum_proxy.planning import speed
    from mellum_proxy.planning.fit_report import deadline_ms

    try:
        trace, events = speed.read_events(args.trace, args.limit_events)
    except (OSError, ValueError) as exc:
        fail(f"fit: cannot read the typing: {exc}")
    runs = speed.plan(args.spec or (speed.BASELINE,), args.cache_reuse or (0,))
    print(f"speed: {len(runs)} runs of {len(events)} edits of {trace} at {choice.chosen.candidate.name}", flush=True)
    measured: list[speed.SpeedRun] = []
    partial = None
    try:
        measured = asyncio.run(
            speed.measure(
                choice.chosen.candidate,
                options,
                runs,
                events,
                48,
                deadline_ms(choice.chosen),
                lambda line: print(line, flush=True),
            )
        )
    except KeyboardInterrupt:
        partial = "interrupted in the speed candidates; the memory candidates are complete"
        print("fit: interrupted; the server it started is stopped", file=sys.stderr)
    spec, reuse, why = speed.choose(measured) if partial is None else (speed.BASELINE, 0, partial)
    report = {"trace": trace, "edits": len(events), "why": why,
              "candidates": [run.summary(choice.chosen.candidate) for run in measured]}  # fmt: skip
    print(f"speed: spec {spec}, cache reuse {reuse} ({why})", flush=True)
    return report, replace(choice, spec=spec, cache_reuse=reuse), partial


def _editor_side(args: argparse.Namespace, choice: Choice, options: FitOptions) -> bool:
    """Profile the chosen server, tune the policies on it, merge the choice; True when interrupted."""
    from mellum_proxy.planning.editor_side import merged_toml, profile_chosen, tune_on
    from mellum_proxy.tuning.reporting.tune_report import verdict

    print(f"editor side: profiling the chosen server ({choice.chosen.candidate.name})", flush=True)
    try:
        measured = asyncio.run(
            profile_chosen(
                choice.chosen.candidate, options, lambda text: print(f"  {text}"), choice.spec, choice.cache_reuse
            )
        )
    except KeyboardInterrupt:
        print("fit: interrupted; the server it started is stopped, the server side is written", file=sys.stderr)
        return True
    except Exception as exc:  # the server side stays written; this part says why it is missing
        fail(f"fit: the editor side failed while profiling: {exc or type(exc).__name__}")
    try:
        result = tune_on(measured, args.trace, args.limit_events, lambda text: print(f"  {text}"))
    except (OSError, ValueError) as exc:
        fail(f"fit: cannot read the typing: {exc}")
    (args.out / "profile.json").write_bytes(measured.as_json())
    (args.out / "tune.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    config = args.out / "config.toml"
    config.write_text(merged_toml(config.read_text(), result["settings"]))
    with (args.out / "fit.md").open("a") as report:
        settings = orjson.dumps(result["settings"]).decode()
        report.write(f"\nEditor side: `tune` over {', '.join(p.name for p in args.trace)} on the chosen server's "
                     f"profile (`profile.json`) chose **{result['chosen']}** `{settings}` (`tune.json`), "
                     "merged into `config.toml`.\n")  # fmt: skip
    print(f"editor side: tune chose {result['chosen']}; merged into {config}")
    for line in verdict(result):
        print(f"  {line}")
    return False


def _mark_partial(out: Path, partial: str) -> None:
    report = orjson.loads((out / "fit.json").read_bytes())
    (out / "fit.json").write_bytes(orjson.dumps({**report, "interrupted": True, "partial": partial},
                                                option=orjson.OPT_INDENT_2))  # fmt: skip
    with (out / "fit.md").open("a") as text:
        text.write(f"\n**Partial run: {partial}.**\n")


def _server_name(args: argparse.Namespace, infos: list[ModelInfo]) -> str:
    files = ", ".join(info.path.name for info in infos)
    if args.embedded:
        return f"embedded llama.cpp (xllamacpp, CPU, {args.threads} thread(s)), {files}"
    return f"`{args.server_cmd}`, {files}"


def _write(args: argparse.Namespace, spec: SweepSpec, measured: list[Measurement], choice: Choice | None,
           because: str, floor: float | None, partial: str | None, server: str,
           speed: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Write the run's files; a `partial` run (interrupted) says so in each, and prints no "next" line."""
    from mellum_proxy.tuning.reporting.writing import command_line  # the bench loads only when a command runs

    overhead = overhead_gib(spec)
    meta = {"command": command_line("mellum-proxy", skip=1), "server": server, "gpu_gib": spec.gpu_gib,
            "margin": spec.margin, "context": spec.business_context, "interrupted": partial is not None,
            "partial": partial,
            "paper_note": f"Paper: `sweep` with the {spec.backend} overhead ({overhead:g} GiB)."}  # fmt: skip
    report = as_json(meta, measured, choice, because, floor)
    if speed is not None:
        report["speed"] = speed
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fit.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        (args.out / "fit.md").write_text(render(report, choice))
        drawn = plot(report, args.out / "fit.png")
        (args.out / "logs").mkdir(exist_ok=True)
        for number, run in enumerate(measured, 1):  # each server's own words (the home folder as ~)
            (args.out / "logs" / f"candidate-{number}.log").write_text(run.log.replace(str(Path.home()), "~"))
        if choice is not None:
            warning = f"# PARTIAL: fit was {partial}; rerun it to measure the rest\n" if partial else ""
            (args.out / "defaults.env").write_text(warning + choice.env())
            packaged = not args.model
            (args.out / "config.toml").write_text(warning + config_toml(choice, args.embedded, packaged))
    except OSError as exc:
        fail(f"cannot write to {args.out}: {exc.strerror}")
    written = ["fit.json", "fit.md", *(["fit.png"] if drawn else []), "logs/",
               *(["defaults.env", "config.toml"] if choice else [])]  # fmt: skip
    print(f"wrote {', '.join(str(args.out / name) for name in written)}")
    if choice is not None and partial:
        print(choice.env().rstrip())
        print(f"fit: a partial run ({partial}): the files say so; rerun it before serving with them")
    elif choice is not None:
        print(choice.env().rstrip())
        start = "--embedded" if args.embedded else "--upstream URL"
        print(f"next: mellum-proxy serve --config {shlex.quote(str(args.out / 'config.toml'))} {start}")
