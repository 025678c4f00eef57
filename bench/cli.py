"""`mellum-proxy bench replay|convert|synth`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from bench.trace import Event, Trace, TraceError, limited, read_trace, write_trace
from proxy.config import upstream_base_url
from proxy.console import INDEX, POSITIVE, SHARE, Parser, fail, real


def load_trace(path: Path) -> Trace:
    """A `mellum-trace/1` file, or a josephg editing-traces file (converted on the fly)."""
    if path.name.endswith((".json.gz", ".json")):
        from bench.convert import from_josephg

        return from_josephg(path)
    return read_trace(path)


def build_parser() -> Parser:
    bench = Parser(prog="mellum-proxy bench", description="replay keystroke traces through the proxy, compare policies")
    sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=Parser)
    replay = sub.add_parser("replay", help="replay traces under several policies against one upstream")
    replay.add_argument("traces", nargs="+", type=Path)
    replay.add_argument("--upstream", required=True, help="URL, 'embedded', or 'sim[:PROFILE]' (embedded-cpu, fast)")
    replay.add_argument(
        "--policy", action="append", required=True, help="NAME[:key=value,...]; 'direct' is the baseline"
    )
    replay.add_argument("--out", type=Path, required=True)
    replay.add_argument("--limit-events", type=POSITIVE, help="stop after this many edits")
    replay.add_argument("--pause-ms", type=real(0), default=300, help="a gap this long is a pause [default: 300]")
    replay.add_argument("--max-gap-ms", type=real(0), default=2000, help="shorten longer gaps to this [default: 2000]")
    replay.add_argument("--max-tokens", type=POSITIVE, default=64, help="what the plugin asks for [default: 64]")
    replay.add_argument("--developers", type=POSITIVE, default=1,
                        help="replay the traces at once as this many developers, each with its own proxy "
                             "(trace i for developer i, round robin) [default: 1: one after another]")  # fmt: skip

    team = sub.add_parser("team", help="2 embedded workers behind vllm-router, 3 developers' proxies, failover")
    team.add_argument("traces", nargs="*", type=Path, help="one per developer [default: the shipped traces, then "
                      "synthetic typing of bench/code]")  # fmt: skip
    team.add_argument("--router-bin", default="vllm-router", help="the vllm-router executable [default: on PATH]")
    team.add_argument("--developers", type=POSITIVE, default=3, help="[default: 3]")
    team.add_argument("--limit-events", type=POSITIVE, default=250, help="edits per developer [default: 250]")
    team.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    team.add_argument("--health-interval-ms", type=POSITIVE, default=500, help="the proxies' [default: 500]")
    team.add_argument("--out", type=Path, default=Path("bench/out/team"))

    convert = sub.add_parser("convert", help="josephg editing-traces, ProgSnap2 CSV or a proxy recording -> trace")
    convert.add_argument("source", type=Path)
    convert.add_argument("--from", dest="kind", choices=["josephg", "progsnap2", "recording"], required=True)
    convert.add_argument("--out", type=Path, required=True)

    ladder = sub.add_parser("ladder", help="prompt length x concurrency against a real server: TTFT, memory, failures")
    ladder.add_argument("--upstream", required=True, help="URL or 'embedded'")
    ladder.add_argument("--via-proxy", action="store_true", help="run the same workload through the proxy")
    ladder.add_argument(
        "--proxy-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a proxy setting for --via-proxy (repeatable)",
    )
    ladder.add_argument("--contexts", default="short,mid,long", help="prompt tokens, or short,mid,long [default]")
    ladder.add_argument("--concurrency", default="1,2,4", help="requests at once [default: 1,2,4]")
    ladder.add_argument("--repeat", type=POSITIVE, default=5, help="requests per cell [default: 5]")
    ladder.add_argument("--max-tokens", type=POSITIVE, default=64)
    ladder.add_argument("--code", type=Path, help="the code snippet [default: the shipped bench/code corpus]")
    ladder.add_argument(
        "--context-limit", type=POSITIVE, help="the server's context per request [default: from /props]"
    )
    ladder.add_argument("--gpu", type=INDEX, default=0)
    ladder.add_argument("--upstream-pid", type=POSITIVE, help="server PID, for its host memory")
    ladder.add_argument("--out", type=Path, default=Path("bench/out/ladder"))

    quality = sub.add_parser("quality", help="HumanEval single-line infilling acceptance set")
    quality.add_argument("--upstream", help="URL or 'embedded'")
    quality.add_argument("--via-proxy", action="store_true")
    quality.add_argument("--proxy-setting", action="append", default=[], metavar="KEY=VALUE")
    quality.add_argument("--template", default="mellum", help="FIM template [default: mellum]")
    quality.add_argument("--limit", type=POSITIVE, help="the first N tasks")
    quality.add_argument("--execute", action="store_true", help="run the problems' tests (not a sandbox!)")
    quality.add_argument(
        "--compare", nargs=2, type=Path, metavar=("A.json", "B.json"), help="what got worse from A to B"
    )
    quality.add_argument("--out", type=Path, default=Path("bench/out/quality"))

    merged = sub.add_parser(
        "report",
        help="one report from the policies of several results.json files "
        "(a later file's policy replaces a same-named one)",
    )
    merged.add_argument("results", nargs="+", type=Path)
    merged.add_argument("--out", type=Path, required=True)
    merged.add_argument("--only", help="comma-separated policy names to keep [default: all]")

    overhead = sub.add_parser("overhead", help="what the proxy adds per request: direct, a bare relay, the proxy")
    overhead.add_argument("--requests", type=POSITIVE, default=500, help="per path and round [default: 500]")
    overhead.add_argument("--rounds", type=POSITIVE, default=3, help="interleaved rounds [default: 3]")
    overhead.add_argument("--tokens", type=POSITIVE, default=16, help="streamed tokens per request [default: 16]")
    overhead.add_argument("--out", type=Path, default=Path("bench/out/overhead"))

    budget = sub.add_parser("budget", help="the exact budget per keystroke: agreement, pre-upstream time, /tokenize")
    budget.add_argument("--keystrokes", type=POSITIVE, default=40, help="typed per file size [default: 40]")
    budget.add_argument("--replay", type=POSITIVE, default=300, help="keystrokes replayed [default: 300]")
    budget.add_argument("--out", type=Path, default=Path("bench/out/budget"))
    first = sub.add_parser("first-run", help="a newcomer's `make run`: time to healthy, to the first completion, "
                           "and what six completions show")  # fmt: skip
    first.add_argument("--busy", type=INDEX, default=1, help="processes keeping a core busy meanwhile [default: 1]")
    first.add_argument("--out", type=Path, default=Path("bench/out/first-run"))
    first.add_argument("serve_args", nargs="*", help="extra `serve` flags, after --")
    memory = sub.add_parser("memory", help="the proxy's resident memory, idle and over many requests")
    memory.add_argument("--requests", type=POSITIVE, default=100_000, help="streaming requests [default: 100000]")
    memory.add_argument("--clients", type=POSITIVE, default=8, help="concurrent clients [default: 8]")
    memory.add_argument("--gguf", type=Path, help="also run with this GGUF's vocabulary as the tokenizer")
    memory.add_argument("--out", type=Path, default=Path("bench/out/memory"))
    soak = sub.add_parser("soak", help="many mixed requests with upstream faults: RSS, fds, tasks, log completeness")
    soak.add_argument("--requests", type=POSITIVE, default=100_000, help="requests in all [default: 100000]")
    soak.add_argument("--clients", type=POSITIVE, default=8, help="concurrent editors [default: 8]")
    soak.add_argument("--seed", type=INDEX, default=0, help="of the request mix [default: 0]")
    soak.add_argument("--out", type=Path, default=Path("bench/out/soak"))
    synth = sub.add_parser("synth", help="a seeded synthetic trace typing a source file")
    synth.add_argument("source", type=Path)
    synth.add_argument("--out", type=Path, required=True)
    synth.add_argument("--seed", type=INDEX, default=0)
    synth.add_argument("--limit-chars", type=POSITIVE)
    synth.add_argument("--typist", choices=["slow", "medium", "fast"], default="medium",
                       help="median gap between keys: 550, 200 or 120 ms [default: medium]")  # fmt: skip

    calibrate = sub.add_parser("calibrate", help="one trace on the real embedded server and on the lab's simulator")
    calibrate.add_argument("trace", type=Path)
    calibrate.add_argument("--limit-events", type=POSITIVE, default=300, help="edits [default: 300]")
    calibrate.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    calibrate.add_argument("--accuracy", type=SHARE, default=0.0,
                           help="the simulated model's (gemma is not a FIM model) [default: 0]")  # fmt: skip
    calibrate.add_argument("--out", type=Path, default=Path("bench/out/calibration"))

    lab = sub.add_parser("lab", help="policies x traces x servers in virtual time: targets, grid and frontier")
    lab.add_argument("traces", nargs="*", type=Path,
                     help="traces [default: the two shipped ones and three synthetic typists]")  # fmt: skip
    lab.add_argument("--profile", action="append", help="sim profile(s) [default: embedded-cpu and gpu]")
    lab.add_argument("--policy", action="append", help="NAME[:key=value,...] [default: direct and defaults]")
    lab.add_argument("--grid", action="store_true", help="also search the adaptive-dispatch settings")
    lab.add_argument("--accuracy", type=SHARE, default=0.3,
                     help="share of completions that are what the person typed next [default: 0.3]")  # fmt: skip
    lab.add_argument("--limit-events", type=POSITIVE, default=1500, help="edits per trace [default: 1500]")
    lab.add_argument("--max-tokens", type=POSITIVE, default=16, help="what the plugin asks for [default: 16]")
    lab.add_argument("--out", type=Path, default=Path("bench/out/lab"))
    return bench


def _write(out: Path, name: str, result: dict[str, Any], render: Any) -> None:
    """`NAME.json` and `NAME.md` in `out`, and the Markdown on stdout."""
    text = render(result, _command())
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(orjson_dumps(result | {"command": _command()}))
        (out / f"{name}.md").write_text(text)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    print(text, end="")
    print(f"wrote {out}/{name}.md and {name}.json")


def _overhead(args: argparse.Namespace) -> None:
    from bench import overhead

    result = asyncio.run(overhead.measure(args.requests, args.rounds, args.tokens, progress=print))
    _write(args.out, "overhead", result, overhead.render)


def _first_run(args: argparse.Namespace) -> None:
    from bench import first_run

    result = asyncio.run(first_run.run(args.busy, extra=tuple(args.serve_args)))
    _write(args.out, "first-run", result, lambda result, command: first_run.render(result))


def _budget(args: argparse.Namespace) -> None:
    from bench import hot_budget

    _write(args.out, "budget", asyncio.run(hot_budget.measure(args.keystrokes, args.replay, progress=print)),
           hot_budget.render)  # fmt: skip


def _soak(args: argparse.Namespace) -> None:
    from bench import soak

    result = asyncio.run(soak.measure(args.requests, args.clients, args.seed, progress=print))
    _write(args.out, "soak", result, soak.render)
    if result["answered_not_logged"] or "500" in result["statuses"]:
        fail("soak: an answer was a 500 or went unlogged (see the report)")


def _memory(args: argparse.Namespace) -> None:
    from bench import memory

    if args.gguf is not None and not args.gguf.is_file():
        fail(f"--gguf {args.gguf}: no such file")
    result = asyncio.run(memory.measure(args.requests, args.clients, args.gguf, progress=print))
    _write(args.out, "memory", result, memory.render)


def _calibrate(args: argparse.Namespace) -> None:
    from bench import calibration

    try:
        events = list(limited(load_trace(args.trace), args.limit_events))
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))

    async def run() -> dict[str, Any]:
        async with upstream_for("embedded") as (url, described):
            return await calibration.measure(events, args.trace.name, url, described, args.max_tokens, args.accuracy)

    _write(args.out, "calibration", asyncio.run(run()), calibration.render)


def _lab(args: argparse.Namespace) -> None:
    from bench import lab_report

    try:
        result = lab_report.measure(args.traces, args.profile, args.policy, args.grid, args.accuracy,
                                    args.limit_events, args.max_tokens, progress=print)  # fmt: skip
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    _write(args.out, "lab", result, lab_report.render)
    lab_report.plot(result, args.out / "frontier.png")
    print(f"wrote {args.out}/frontier.png")


def main(argv: list[str]) -> None:
    """`mellum-proxy bench ...` (the proxy's CLI hands over everything after `bench`)."""
    run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> None:
    handlers = {"replay": _replay, "convert": _convert, "synth": _synth, "ladder": _ladder, "quality": _quality,
                "report": _report, "overhead": _overhead, "budget": _budget, "first-run": _first_run,
                "memory": _memory, "soak": _soak, "lab": _lab, "calibrate": _calibrate, "team": _team}  # fmt: skip
    handlers[args.bench_command](args)


def _convert(args: argparse.Namespace) -> None:
    from bench import convert

    readers = {
        "josephg": convert.from_josephg,
        "progsnap2": convert.from_progsnap2,
        "recording": convert.from_recording,
    }
    try:
        trace = readers[args.kind](args.source)
    except (OSError, TraceError, KeyError, ValueError) as exc:
        fail(f"cannot convert {args.source}: {exc}")
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {trace.edits} edits")


def _synth(args: argparse.Namespace) -> None:
    from bench.synth import synthesize_file

    try:
        trace = synthesize_file(args.source, args.seed, args.limit_chars, args.typist)
    except OSError as exc:
        fail(f"cannot read {args.source}: {exc.strerror}")
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {trace.edits} edits")


@contextlib.asynccontextmanager
async def upstream_for(spec: str) -> AsyncIterator[tuple[str, str]]:
    """(URL, description) of the upstream: a URL, the embedded llama.cpp server, or the simulator."""
    if spec == "embedded":
        from proxy.upstream.embedded import EmbeddedServer

        server = EmbeddedServer(ctx_tokens=4096, slots=2)
        url = await asyncio.to_thread(server.start)
        try:
            yield url, "embedded llama.cpp (gemma-3-270m Q4_K_M, 2 slots x 2048 tokens, CPU)"
        finally:
            await asyncio.to_thread(server.stop)
    elif spec.startswith("sim"):
        from bench.sim import SimServer, profile
        from proxy.http import serve_app

        chosen = profile(spec.partition(":")[2] or "embedded-cpu")
        async with serve_app(SimServer(chosen).app()) as url:
            yield url, f"sim:{chosen.name} ({chosen.source})"
    else:
        yield upstream_base_url(spec), spec


def _replay(args: argparse.Namespace) -> None:
    from bench.replay import parse_policy

    try:
        policies = [parse_policy(text) for text in args.policy]
        events: list[Event] = []
        traces = [list(limited(load_trace(path), args.limit_events)) for path in args.traces]
        for trace in traces:  # several traces play one after another
            offset = events[-1].t_ms + 2000 if events else 0
            events += [replace(e, t_ms=e.t_ms + offset) for e in trace]
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    command = "mellum-proxy bench " + shlex.join(sys.argv[2:]) if len(sys.argv) > 2 else "mellum-proxy bench replay"
    if args.developers > 1:
        developers = [traces[i % len(traces)] for i in range(args.developers)]
        asyncio.run(_run_developers(args, policies, developers, command))
        return
    asyncio.run(_run_all(args, policies, events, command))


async def _run_developers(
    args: argparse.Namespace, policies: list[Any], developers: list[list[Event]], command: str
) -> None:
    from bench import report
    from bench.team import developers_markdown, run_developers

    results = []
    async with upstream_for(args.upstream) as (url, described):
        print(f"upstream: {described}; {len(developers)} developers at once, each with its own proxy")
        for policy in policies:
            group = await run_developers(policy, developers, url, args.pause_ms, args.max_gap_ms, args.max_tokens)
            print(developers_markdown(group), end="")
            results += group
    notes = [f"upstream: {described}", f"{len(developers)} developers at once (trace i for developer i)"]
    for path in report.write(results, args.out, command, notes):
        print(f"wrote {path}")
    with (args.out / "report.md").open("a") as sink:
        sink.write("\n" + developers_markdown(results))


def _team(args: argparse.Namespace) -> None:
    import shutil

    from bench.replay import parse_policy
    from bench.synth import synthesize_file
    from bench.team import run_team, team_report

    router = shutil.which(args.router_bin) or args.router_bin
    if not Path(router).is_file():
        fail(f"vllm-router not found at {args.router_bin}: pip install vllm-router, or pass --router-bin PATH")
    paths = args.traces or sorted(Path("bench/traces").glob("*.json.gz"))
    try:
        developers = [list(limited(load_trace(path), args.limit_events)) for path in paths][: args.developers]
        sources = sorted(Path("bench/code").glob("inventory.*"))
        for seed, source in enumerate(sources[: max(0, args.developers - len(developers))]):
            developers.append(list(limited(synthesize_file(source, seed=seed), args.limit_events)))
    except (OSError, TraceError, ValueError) as exc:
        fail(str(exc))
    if len(developers) < args.developers:
        fail(f"{args.developers} developers need as many traces; found {len(developers)}")
    policy = parse_policy("proxy")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm-router.log").write_bytes(b"")
    phases = asyncio.run(run_team(router, developers, policy, args.out, args.max_tokens, args.health_interval_ms))
    names = [str(p) for p in paths][: args.developers] + [f"synthetic typing of {s}" for s in sources][
        : max(0, args.developers - len(paths))
    ]
    notes = [
        "workers: 2 embedded llama.cpp servers (gemma-3-270m Q4_K_M, 2 slots, 1 thread, swa_full for prefix reuse), "
        "each behind a counting relay; router: vllm-router, health checked every 1 s; fallback: one more embedded "
        "server, shared by the developers (on their own machines each has one)",
        f"developers: {', '.join(names)} ({args.limit_events} edits each), proxies with default settings, "
        f"--upstream ROUTER --upstream LOCAL, health every {args.health_interval_ms} ms",
        "failed = completions the proxy answered with upstream_error; cached share = cached / prompt tokens over the "
        "requests that ran to their end (a cancelled stream carries no usage)",
    ]
    for path in team_report(phases, _command(), notes, args.out):
        print(f"wrote {path}")


async def _run_all(args: argparse.Namespace, policies: list[Any], events: list[Event], command: str) -> None:
    from bench import report
    from bench.replay import run_policy

    async with upstream_for(args.upstream) as (url, described):
        print(f"upstream: {described}")
        print("order: " + " -> ".join(p.name for p in policies))
        results = []
        for policy in policies:
            results.append(await run_policy(policy, events, url, args.pause_ms, args.max_gap_ms, args.max_tokens,
                                            _progress_bar(policy.name, len(events))))  # fmt: skip
            r = results[-1]
            print(f"{policy.name}: {r.upstream_requests} upstream requests, {r.shown} shown, coverage "
                  f"{(r.pause_coverage or 0):.0%}, p95 {r.latency_p95_ms or 0:.0f} ms")  # fmt: skip
    timing = (
        f"{results[0].edits} edits; pauses are gaps >= {args.pause_ms:g} ms; gaps > {args.max_gap_ms:g} ms shortened"
    )
    notes = [f"upstream: {described}", timing, "policy order: " + " -> ".join(p.name for p in policies)]
    for path in report.write(results, args.out, command, notes):
        print(f"wrote {path}")


def _progress_bar(name: str, total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = tqdm(total=total, desc=name, unit="event", leave=True, file=sys.stderr)

    def update(position: int, in_flight: int) -> None:
        bar.n = position + 1
        bar.set_postfix(in_flight=in_flight, refresh=False)
        if position % 25 == 0 or position + 1 == total:
            bar.refresh()
        if position + 1 == total:
            bar.close()

    return update


def _settings_policy(args: argparse.Namespace) -> Any:
    from bench.replay import parse_policy

    name = "proxy:" + ",".join(args.proxy_setting) if args.via_proxy else "direct"
    try:
        return parse_policy(name)
    except ValueError as exc:
        fail(str(exc))


def _command() -> str:
    """The command line as a reader would retype it; the home directory is written `~`, so no report
    carries a user's own paths."""
    home = str(Path.home())
    args = ["~" + arg[len(home) :] if arg == home or arg.startswith(home + "/") else arg for arg in sys.argv[2:]]
    return "mellum-proxy bench " + " ".join(arg if arg.startswith("~/") else shlex.quote(arg) for arg in args)


async def _context_limit(url: str) -> int | None:
    """Context per request: llama.cpp /props (per slot), else vLLM's /v1/models max_model_len."""
    async with aiohttp.ClientSession() as session:
        for path in ("/props", "/v1/models"):
            try:
                async with session.get(url + path) as resp:
                    body = await resp.json(content_type=None)
            except Exception:  # any failure here means "not this server kind"
                continue
            if path == "/props" and isinstance(body, dict):
                n_ctx = (body.get("default_generation_settings") or {}).get("n_ctx")
                if isinstance(n_ctx, int):
                    return n_ctx
            if path == "/v1/models" and isinstance(body, dict):
                for model in body.get("data") or []:
                    if isinstance(model, dict) and isinstance(model.get("max_model_len"), int):
                        return int(model["max_model_len"])
    return None


def _ladder(args: argparse.Namespace) -> None:
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        fail(f"--concurrency takes comma-separated numbers, got '{args.concurrency}'")
    asyncio.run(_run_ladder(args, concurrencies))


async def _run_ladder(args: argparse.Namespace, concurrencies: list[int]) -> None:
    import os

    from bench import ladder
    from bench.corpus import code_texts
    from bench.replay import proxy_for
    from proxy.budget.tokenizers import upstream_counter
    from proxy.errors import UpstreamError
    from proxy.telemetry import GpuSampler, NvmlBackend
    from proxy.upstream import UpstreamClient

    code = args.code.read_text() if args.code else "\n".join(code_texts() * 3)
    async with upstream_for(args.upstream) as (url, described):
        pid = args.upstream_pid or (os.getpid() if args.upstream == "embedded" else None)
        limit = args.context_limit or await _context_limit(url)
        names = {"short": 256, "mid": 1024, "long": (limit or 2048) - args.max_tokens - 16}
        try:
            contexts = [names[c] if c in names else int(c) for c in args.contexts.split(",")]
        except ValueError:
            fail(f"--contexts takes numbers or short,mid,long, got '{args.contexts}'")
        async with aiohttp.ClientSession() as session:
            client = UpstreamClient(session, url)
            model = await client.served_model()
            counter = await upstream_counter(client, model)  # with each token's text, else by count
            if counter is None:
                fail("the server has no /tokenize to cut prompts to exact token counts with")
            try:
                prompts = {n: await ladder.cut_to_tokens(code, n, counter) for n in contexts}
            except (UpstreamError, ValueError) as exc:
                fail(f"cannot cut the prompts with the server's /tokenize: {exc}")
        gpu = GpuSampler(lambda: NvmlBackend(args.gpu, pid))
        gpu.open()
        async with proxy_for(_settings_policy(args), url) as (target, _):
            print(f"upstream: {described}; context limit {limit}; {'via proxy' if args.via_proxy else 'direct'}")
            cells = await ladder.run_ladder(target + "/v1/completions", prompts, concurrencies, args.repeat,
                                            args.max_tokens, gpu, pid, progress=print, model=model)  # fmt: skip
        gpu.close()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": _command(), "upstream": described, "context_limit": limit, "via_proxy": args.via_proxy,
            "vram_source": gpu.source, "vram_reason": gpu.reason}  # fmt: skip
    (args.out / "ladder.json").write_bytes(ladder.as_json(cells, meta))
    text = f"`{_command()}`\n\n{ladder.table(cells)}\n"
    (args.out / "ladder.md").write_text(text)
    ladder.plot(cells, args.out / "ladder.png")
    print(text)
    print(f"wrote {args.out / 'ladder.json'}, {args.out / 'ladder.md'}, {args.out / 'ladder.png'}")


def _quality(args: argparse.Namespace) -> None:
    import orjson

    from bench import quality

    if args.compare:
        try:
            a, b = (orjson.loads(path.read_bytes()) for path in args.compare)
        except (OSError, orjson.JSONDecodeError) as exc:
            fail(f"cannot read the runs to compare: {exc}")
        result = quality.compare(a, b)
        first, second = args.compare
        print(
            f"{result['common_tasks']} common tasks scored by {result['scored_by']}: {len(result['worse'])} worse, "
            f"{len(result['better'])} better from {first} to {second}"
        )
        for task in result["worse"]:
            print(f"  worse: {task}")
        return
    if not args.upstream:
        fail("--upstream is required (unless --compare)")
    try:
        problems = quality.load_problems()
        quality.template_for(args.template)  # an unknown template name is one readable line
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
    tasks = quality.build_tasks(problems)[: args.limit]
    asyncio.run(_run_quality(args, tasks, {p["task_id"]: p for p in problems}))


async def _run_quality(args: argparse.Namespace, tasks: list[Any], problems: dict[str, Any]) -> None:
    from bench import quality
    from bench.replay import proxy_for

    policy = _settings_policy(args)
    if args.via_proxy and policy.settings is not None:
        policy.settings.setdefault("fim_template", args.template)
    async with upstream_for(args.upstream) as (url, described), proxy_for(policy, url) as (target, _):
        bar = _progress_bar("quality", len(tasks))
        results = await quality.run_quality(target + "/v1/completions", tasks, args.template, args.via_proxy,
                                            execute=args.execute, problems=problems,
                                            progress=(lambda n: bar(n, 0)) if bar else None)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": _command(), "upstream": described, "template": args.template, "via_proxy": args.via_proxy,
            "proxy_settings": policy.settings}  # fmt: skip
    path = args.out / "quality.json"
    path.write_bytes(quality.as_json(meta, results))
    print(orjson_dumps(quality.summary(results)))
    print(f"wrote {path}")


def orjson_dumps(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def _report(args: argparse.Namespace) -> None:
    from bench import report

    results: list[Any] = []
    notes: list[str] = []
    try:
        for path in args.results:
            loaded, data = report.load(path)
            if args.only:
                loaded = [r for r in loaded if r.policy in args.only.split(",")]
            replaced = {r.policy for r in loaded}  # a later file's policy replaces an earlier one of that name
            results = [r for r in results if r.policy not in replaced] + loaded
            notes.append(f"{', '.join(r.policy for r in loaded)} from `{data['command']}`")
            notes += [
                note for note in data.get("notes", []) if note not in notes and not note.startswith("policy order")
            ]
    except (OSError, KeyError, ValueError) as exc:
        fail(f"cannot read the results: {exc}")
    for path in report.write(results, args.out, _command(), notes):
        print(f"wrote {path}")
