"""The library's import graph (imports inside functions included) runs one way: layers import only
the layers below them (docs/architecture.md), no module is part of a cycle, nothing imports a
rudder module from inside a function, the offline analysis never imports MPI (not even through
another module), and the run path (what drivers/train.py imports) never reaches the analysis or
the simulator or the network shaper. One import made inside a function is deliberate and listed
(ROLE_IMPORTS): a rank imports the trainer, and torch with it, only once it knows it trains."""
from __future__ import annotations

import ast
import os

from conftest import REPO

# Bottom up; a module may import its own layer and the layers before it. The offline tools come
# last and do not import each other; netem (the shaped network) imports no other layer at all and
# no layer imports it. The entry modules kept for ``python -m`` names come
# after everything and nothing imports them.
LAYERS = ["registry", "comm", "logs", "data", "sampling", "agent", "prefetch", "train", "sim", "plan", "analysis", "netem"]
ENTRY_MODULES = {"rudder.analyze", "rudder.simulate", "rudder.classifier"}
MPI = "mpi4py"
# Imports of the library made inside a function on purpose, none of them dodging a cycle (the
# graph's checks include them): {module: [what it imports there]}.
ROLE_IMPORTS = {"rudder.train.job": ["rudder.train.trainer"]}


def module_name(path: str) -> str:
    name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, list[str]]]:
    """(rudder imports per module, third-party top-level imports per module, rudder imports made
    inside a function per module)."""
    files = {}
    for folder, _, names in os.walk(os.path.join(REPO, "rudder")):
        files.update({module_name(os.path.join(folder, n)): os.path.join(folder, n) for n in names if n.endswith(".py")})

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    internal, external, in_functions = {}, {}, {}
    for module, path in files.items():
        tree = ast.parse(open(path).read(), path)
        internal[module], external[module], in_functions[module] = set(), set(), []
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        nested = {id(n) for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                raise AssertionError(f"{module}: relative import; the library imports by absolute name")
            else:
                continue
            for name in names:
                if name.split(".")[0] != "rudder":
                    external[module].add(name.split(".")[0])
                    continue
                target = resolve(name)
                if target and target != module and not module.startswith(target + "."):
                    internal[module].add(target)
                    if id(node) in nested:
                        in_functions[module].append(target)
    return internal, external, in_functions


def layer(module: str) -> int:
    if module in ENTRY_MODULES:
        return len(LAYERS)
    return LAYERS.index(module.split(".")[1]) if module != "rudder" else -1


def closure(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_cycles_and_layers_import_downwards():
    internal, _, in_functions = import_graph()
    assert len(internal) > 40  # the whole library was read
    assert cycles(internal) == []
    upward = [f"{m} -> {t}" for m, targets in internal.items() for t in targets if layer(t) > layer(m)]
    assert upward == [], upward
    assert not any(t in ENTRY_MODULES for targets in internal.values() for t in targets)
    tools = [f"{m} -> {t}" for m, targets in internal.items() for t in targets
             if {m.split(".")[1], t.split(".")[1]} == {"sim", "analysis"}]
    assert tools == [], tools  # the two offline tools stand side by side
    netem = [f"{m} -> {t}" for m, targets in internal.items() for t in targets
             if (m.split(".")[1] == "netem") != (t.split(".")[1] == "netem")]
    assert netem == [], netem  # the shaped network stands alone
    assert {m: sorted(set(t)) for m, t in in_functions.items() if t} == ROLE_IMPORTS  # none dodging a cycle


def test_analysis_imports_no_mpi_and_the_run_path_no_tool():
    internal, external, _ = import_graph()
    analysis = closure(internal, {m for m in internal if m.startswith("rudder.analysis")})
    assert not [m for m in analysis if MPI in external[m]], "the analysis reaches mpi4py"
    run_path = closure(internal, {"rudder.train.job"})
    assert "rudder.train.trainer" in run_path and "rudder.agent.server" in run_path  # the walk follows the driver
    assert not [m for m in run_path if m.startswith(("rudder.analysis", "rudder.sim", "rudder.netem"))]


def test_the_walk_catches_what_it_forbids():
    """The checks above on a graph that breaks every rule: each must fail."""
    bad = {"rudder.comm.a": {"rudder.analysis.x"}, "rudder.analysis.x": {"rudder.comm.a"}}
    assert cycles(bad) == [["rudder.analysis.x", "rudder.comm.a"]]
    assert layer("rudder.analysis.x") > layer("rudder.comm.a")
    assert "rudder.analysis.x" in closure(bad, {"rudder.comm.a"})
