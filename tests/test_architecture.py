"""The house's rules, measured on the tree's own imports (every `import` and `from ... import`, those inside
functions included): no import circle anywhere, and each layer imports only what stands below it.

- kernel_abi: the facts the compiler and the runtime share; imports nothing of this project.
- tl: the language; imports nothing of this project but itself (it knows no CuTe).
- translate: the compiler; never the tuner.
- tuner.serving: the runtime; only itself and kernel_abi (tests/serving/test_serving_host.py also runs it with
  everything else blocked).
- tuner.measure: never the campaign, the commands or the store.
"""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kernel_abi", "tl", "translate", "tuner", "search_spaces", "hardware_profiles")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The project modules ``name`` imports (a package face it sits in is not counted as an import of it)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _circles() -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
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

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def _in(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _breaking(layer: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    return {name: sorted(t for t in targets if not _in(t, *allowed))
            for name, targets in GRAPH.items() if _in(name, layer) and any(not _in(t, *allowed) for t in targets)}


def test_the_scan_sees_the_tree():
    assert len(MODULES) > 120 and "tuner.serving.launch.kernel" in MODULES and "kernel_abi.spec" in MODULES
    assert "tuner.serving.launch.plan" in GRAPH["tuner.serving.launch.kernel"]   # an import it has


def test_no_import_circle():
    assert _circles() == []


def test_the_shared_facts_import_nothing_of_ours():
    assert _breaking("kernel_abi", ("kernel_abi",)) == {}


def test_the_language_knows_no_compiler_and_no_tuner():
    assert _breaking("tl", ("tl",)) == {}


def test_the_compiler_imports_nothing_of_the_tuner():
    assert _breaking("translate", ("translate", "tl", "kernel_abi", "hardware_profiles")) == {}


def test_the_runtime_stands_on_itself_and_the_shared_facts():
    assert _breaking("tuner.serving", ("tuner.serving", "kernel_abi")) == {}


def test_the_measurement_library_is_below_the_campaign_commands_and_store():
    assert _breaking("tuner.measure", ("tuner.measure", "tuner.serving", "kernel_abi", "translate", "tl",
                                       "hardware_profiles")) == {}


def test_the_fork_servers_preload_the_projects_modules_by_their_current_names():
    """multiprocessing's fork server skips a preload it cannot import without a word: a renamed module would quietly
    cost every trial its import time."""
    import importlib.util

    pytest.importorskip("ray")
    from tuner.campaign.workers import PRELOAD

    ours = {m for names in PRELOAD.values() for m in names if m.split(".")[0] in PACKAGES}
    assert ours
    missing = sorted(m for m in ours if importlib.util.find_spec(m) is None)
    assert not missing, f"PRELOAD names modules that do not exist: {missing}"
