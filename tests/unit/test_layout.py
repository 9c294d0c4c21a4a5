"""The layout's rules (ARCHITECTURE.md): no import cycle inside netbench, imports inside functions
included; no module over 500 lines; the pure core imports nothing with side effects; nothing
imports the CLI; the library never prints or exits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "netbench"
MAX_LINES = 500
# processes of their own (a training worker, a delay engine, a host's lease renewal, the
# dashboards generator, the benchmarks): they own their stdout and exit status
ENTRY_POINTS = {"netbench.jobs.worker", "netbench.jobs.torch_worker", "netbench.emulation.engine", "netbench.state.lease",
                "netbench.metrics.dashboards", "netbench.jobs.collective_bench",
                "netbench.jobs.exchange_bench"}
PURE = ("netbench.model", "netbench.stats", "netbench.emulation.changes", "netbench.units", "netbench.errors",
        "netbench.emulation.delay_queue", "netbench.emulation.pair_queue")
PURE_MAY_IMPORT = ("netbench.model", "netbench.stats", "netbench.units", "netbench.errors", "netbench.yamlfile",
                   "netbench.emulation.changes", "netbench.emulation.netlink.netem", "netbench.emulation.delay_queue",
                   "netbench.emulation.netlink.disttable")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every netbench module `name` imports, anywhere in the file (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_netbench():
    assert cycles(graph()) == []


def test_no_module_over_500_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_nothing_imports_the_cli():
    offenders = {name: sorted(m for m in deps if m.startswith("netbench.cli"))
                 for name, deps in graph().items() if not name.startswith("netbench.cli")}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("core", PURE)
def test_the_pure_core_imports_no_side_effects(core):
    edges = graph()
    for name in (n for n in edges if n == core or n.startswith(core + ".")):
        bad = sorted(m for m in edges[name] if not m.startswith(PURE_MAY_IMPORT) and m != "netbench")
        assert bad == [], f"{name} imports {bad}"


def test_the_library_never_prints_or_exits():
    offenders = []
    for name, path in modules().items():
        if name.startswith("netbench.cli") or name in ENTRY_POINTS or name.startswith(("netbench.jobs.harness", "netbench.jobs.torch_harness")) \
                or name == "netbench.console":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in ("print", "exit"):
                    offenders.append(f"{name}:{node.lineno} {func.id}()")
                if isinstance(func, ast.Attribute) and func.attr == "exit" and \
                        isinstance(func.value, ast.Name) and func.value.id == "sys":
                    offenders.append(f"{name}:{node.lineno} sys.exit()")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                offenders += [f"{name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "rich"]
    assert offenders == []
