"""The shape of the tree: imports flow one way, cli/serve -> bench -> lifecycle -> search -> methods -> the storage
layers (adopt -> collection -> milvus -> storage -> catalog -> gallery -> ann) -> core; no import cycle between
modules; every package says what it holds and what it may import, and imports nothing else; only the command line
imports typer; nothing imports the command line. Read from the source with ``ast`` (module-level, function-level and
type-only imports alike), nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "nobackfill"

#: a unit (a top-level subpackage or module of nobackfill) may import units of its own rank or below
RANKS = {
    # core: models, data, storage, metrics, the training loop and their plumbing
    "encoders": 0, "data": 0, "metrics": 0, "train": 0, "config": 0, "progress": 0, "report": 0,
    "evaluate": 0, "_logging": 0, "_lazy": 0, "_safetensors": 0, "_atomic": 0, "_interrupts": 0, "memory": 0, "testing": 0,
    # the storage layers, lowest first: vector and key indexes; one space's files; the catalog database; the
    # storage interface and its directory implementation; Milvus; collections of several spaces; adoption
    "ann": 0.1, "gallery": 0.2, "catalog": 0.3, "storage": 0.4, "milvus": 0.5, "collection": 0.6, "adopt": 0.7,
    # the HTTP client of the service imports nothing of the library (benchmarks drive the service with it)
    "client": 3,
    # methods (the seeds)
    "compat": 1, "late": 1, "lingual": 1, "reco": 1,
    # the system: searcher, routes, merges, the model pool; then the life of a collection (plan changes,
    # calibration, the backfill, verify), which searches
    "search": 2, "lifecycle": 2.5,
    # benchmarks and the main job
    "bench": 3, "demo": 3,
    # applications: the command line, the service and its client
    "cli": 4, "serve": 4, "__init__": 4,
}
APPS = {"cli"}


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        yield path, list(rel.parts)


def _imports(path: Path, parts: list[str]) -> list[tuple[str, int]]:
    """(imported dotted name inside nobackfill or an external top-level module, line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    if parts[-1] == "__init__":
        pkg = parts[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                name = ".".join(["nobackfill", *base] + ([node.module] if node.module else []))
                if node.module is None:  # from . import a, b
                    out += [(f"{name}.{a.name}", node.lineno) for a in node.names]
                    continue
            else:
                name = node.module or ""
            out.append((name, node.lineno))
    return out


def _unit(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "nobackfill" and len(parts) > 1 else ("__init__" if dotted == "nobackfill" else None)


def _graph():
    edges: dict[str, dict[str, list[str]]] = {}
    external: list[tuple[str, str, str]] = []
    for path, parts in _modules():
        src_unit = parts[0] if len(parts) > 1 else parts[0]
        for name, line in _imports(path, parts):
            u = _unit(name)
            where = f"{path.relative_to(SRC.parent)}:{line}"
            if u is None:
                external.append((src_unit, name.split(".")[0], where))
            elif u != src_unit:
                edges.setdefault(src_unit, {}).setdefault(u, []).append(where)
    return edges, external


def test_every_unit_has_a_rank():
    units = {parts[0] for _, parts in _modules()}
    assert units <= set(RANKS), f"give these a rank in {__file__}: {sorted(units - set(RANKS))}"


def test_only_the_command_line_imports_typer_or_click():
    _, external = _graph()
    bad = [f"{where} imports {mod}" for unit, mod, where in external if mod in ("typer", "click") and unit not in APPS]
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_command_line():
    edges, _ = _graph()
    bad = [w for src, dst in edges.items() if src != "cli" for w in dst.get("cli", [])]
    assert not bad, "imports of nobackfill.cli: " + ", ".join(bad)


def test_imports_flow_one_way():
    edges, _ = _graph()
    bad = [f"{w}: {src} (rank {RANKS[src]}) imports {dst} (rank {RANKS[dst]})"
           for src, dsts in edges.items() for dst, where in dsts.items() if RANKS[dst] > RANKS[src] for w in where]
    assert not bad, "\n".join(bad)


def test_no_cycle_between_units():
    edges, _ = _graph()
    graph = {s: set(d) for s, d in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle) + "; e.g. " + ", ".join(
                    edges[a][b][0] for a, b in zip(cycle, cycle[1:])))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The rules above can fail: a core module importing a method package is reported."""
    fake = tmp_path / "nobackfill"
    (fake / "gallery").mkdir(parents=True)
    (fake / "compat").mkdir()
    (fake / "gallery" / "x.py").write_text("def f():\n    from ..compat import upgrade\n")
    (fake / "gallery" / "y.py").write_text("from ..catalog.items import Item\n")
    (fake / "compat" / "upgrade.py").write_text("import typer\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    edges, external = _graph()
    assert "compat" in edges["gallery"] and RANKS["compat"] > RANKS["gallery"]
    assert "catalog" in edges["gallery"] and RANKS["catalog"] > RANKS["gallery"]  # a layer below imports one above
    assert any(mod == "typer" and unit == "compat" for unit, mod, _ in external)


def test_the_readme_tables_match_the_committed_results():
    """Every table between ``<!-- results:NAME -->`` markers is benchmarks/results/NAME.md verbatim."""
    from nobackfill.bench.tables import documents, refresh

    for path in documents():  # the README and the docs pages
        text = path.read_text()
        assert refresh(text, SRC.parents[1] / "benchmarks" / "results") == text, \
            f"{path.name}: result tables are stale: run nobackfill bench tables"


def test_bench_modules_stay_small():
    """A benchmark is a config, a loop over methods and a table: method code lives in its package,
    report tables and shared set-ups in their own modules, so no bench module grows past ~300 lines."""
    long = {p.name: n for p in (SRC / "bench").glob("*.py") if (n := len(p.read_text().splitlines())) > 320}
    assert not long, f"bench modules over 320 lines: {long}"


def test_the_readme_cites_only_committed_results():
    """Numbers come from files a reader can open: outside the command examples (fenced blocks, where
    ``runs/`` is where a user's own outputs go), no file under ``runs/`` (ignored by git) is cited,
    and every ``benchmarks/results/`` file named exists."""
    import re

    root = SRC.parents[1]
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    cited_runs = sorted(set(re.findall(r"runs/[\w./{},*-]+\.(?:json|md|html)", prose)))
    assert not cited_runs, f"README cites files under runs/ (not committed): {cited_runs}"
    named = set(re.findall(r"benchmarks/results/([\w.-]+\.(?:json|md|html|png))", readme))
    missing = [n for n in sorted(named) if not (root / "benchmarks" / "results" / n).is_file()]
    assert not missing, f"README names results that are not committed: {missing}"


def test_only_the_benchmarks_and_the_command_line_import_the_benchmarks():
    """The product (the library, the demo, the service) never depends on ``nobackfill.bench``: what a
    benchmark and the product share is library code, which the benchmark imports."""
    edges, _ = _graph()
    bad = [w for src, dst in edges.items() if src not in ("bench", "cli") for w in dst.get("bench", [])]
    assert not bad, "imports of nobackfill.bench: " + ", ".join(bad)


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring and signature (a command's options) not counted."""
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
        else fn.body
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_commands_are_parsing_one_call_and_printing():
    """The command line holds no logic beyond parsing and printing: no module-level function of
    cli/ has a body over 40 lines (the work is one call of the library or the client); every bench
    command runs through the shared runner."""
    long = {f"{p.name}:{n.name}": _body_lines(n) for p in sorted((SRC / "cli").glob("*.py"))
            for n in ast.parse(p.read_text(encoding="utf-8")).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(n) > 40}
    assert not long, f"command-line functions with bodies over 40 lines: {long}"


def test_no_module_over_500_lines():
    """Modules stay readable: one concern each, at most 500 lines."""
    long = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"modules over 500 lines: {long}"


def test_the_length_check_sees_a_long_body():
    src = 'def f(a=1,\n      b=2):\n    """doc"""\n' + "    x = 1\n" * 41
    assert _body_lines(ast.parse(src).body[0]) == 41


# --------------------------------------------------------------------------- modules and packages


def _module_name(path: Path) -> tuple[str, bool]:
    """``("nobackfill.a.b", is_package)`` of a source file under SRC."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _module_graph() -> dict[str, dict[str, int]]:
    """``module -> {imported module: line}`` inside nobackfill: ``from p import x`` is an edge to ``p.x``
    when that is a module, else to ``p`` (its ``__init__``); every import counts, type-only ones too."""
    files = {_module_name(p)[0]: p for p in sorted(SRC.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod for a in node.names]
            else:
                continue
            for t in targets:
                if t in files and t != name:
                    deps.setdefault(t, node.lineno)
        graph[name] = deps
    return graph


def _module_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_cycle_between_modules():
    """No module imports, directly or not, a module that imports it back (type-only imports count: a
    type two modules share lives below both)."""
    graph = _module_graph()
    cycles = _module_cycles(graph)
    msg = ["; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in comp for b in comp if b in graph[a])
           for comp in cycles]
    assert not cycles, "module import cycles:\n" + "\n".join(msg)


def _declared_imports(doc: str) -> set[str] | None:
    """The units a package's docstring says it may import: the paragraph after ``May import:``
    (``nothing of nobackfill`` for none); None when it says nothing."""
    import re

    m = re.search(r"May import:(.*?)(?:\n\s*\n|$)", doc, flags=re.S)
    if m is None:
        return None
    return {w for w in re.findall(r"[a-z_]+", m.group(1)) if w in RANKS}


def _packages() -> list[tuple[str, Path]]:
    return [(_module_name(p)[0], p) for p in sorted(SRC.rglob("__init__.py"))]


def test_every_package_says_what_it_holds_and_may_import():
    """Each package's ``__init__`` docstring says what it holds and, in a ``May import:`` paragraph,
    which units of nobackfill its modules may import."""
    bad = []
    for name, path in _packages():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if len(doc.split()) < 8:
            bad.append(f"{name}: no docstring saying what it holds")
        elif _declared_imports(doc) is None:
            bad.append(f"{name}: its docstring has no 'May import:' paragraph")
    assert not bad, "\n".join(bad)


def test_packages_import_only_what_they_declare():
    """A package's modules (its sub-packages' included) import units of nobackfill that its docstring
    declares, its own unit aside."""
    graph = _module_graph()
    bad = []
    for name, path in _packages():
        declared = _declared_imports(ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")
        if declared is None:
            continue
        own = name.split(".")[1] if "." in name else "__init__"
        for mod, deps in graph.items():
            if mod != name and (name == "nobackfill" or not mod.startswith(name + ".")):
                continue  # the root package's own scope is its __init__ (its other modules are units)
            for dep, line in deps.items():
                unit = _unit(dep)
                if unit not in (own, None) and unit not in declared:
                    bad.append(f"{mod}:{line} imports {dep}, and {name} does not declare '{unit}'")
    assert not bad, "\n".join(bad)


def test_the_checkers_see_a_module_cycle_and_an_undeclared_import(tmp_path, monkeypatch):
    fake = tmp_path / "nobackfill"
    (fake / "gallery").mkdir(parents=True)
    (fake / "gallery" / "__init__.py").write_text('"""One space\'s files on disk, for tests here.\n\nMay import: ``ann``."""\n')
    (fake / "gallery" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (fake / "gallery" / "b.py").write_text("from .a import A\nfrom ..catalog import items\n")
    (fake / "catalog").mkdir()
    (fake / "catalog" / "__init__.py").write_text('"""x"""\n')
    (fake / "catalog" / "items.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert _module_cycles(_module_graph()) == [["nobackfill.gallery.a", "nobackfill.gallery.b"]]
    with pytest.raises(AssertionError, match="does not declare 'catalog'"):
        test_packages_import_only_what_they_declare()
    with pytest.raises(AssertionError, match="nobackfill.catalog: no docstring"):
        test_every_package_says_what_it_holds_and_may_import()


#: packages allowed past ~3k lines or ~15 modules, and why (a plug-in per module, by design)
LARGE_PACKAGES = {
    "nobackfill.bench": "one module per benchmark command (a config, a loop, a table), plus the set-ups and reports "
                        "they share; each under ~300 lines",
    "nobackfill.cli": "one module per command group of the typer app; the commands only parse and print",
    "nobackfill.lingual": "one module per continual-learning method of seed 004 (CLL-CLIP and its baselines: oEWC, "
                          "ER / DER, LoRA, prompt, DualPrompt, CODA-Prompt) as plug-ins of one learner",
}


def test_packages_stay_small():
    """No package holds more than ~3k lines or ~15 modules of its own (sub-packages apart), except the
    plug-in packages named in LARGE_PACKAGES with the reason."""
    big = {}
    for name, init in _packages():
        mods = sorted(init.parent.glob("*.py"))
        lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in mods)
        if (lines > 3200 or len(mods) > 16) and name not in LARGE_PACKAGES:
            big[name] = f"{len(mods)} modules, {lines} lines"
    assert not big, f"packages over ~3k lines or ~15 modules (split them by what they hold): {big}"
