"""The package's shape, read from the source with ``ast``: imports of yxanul's own modules only go
down (no cycle between modules, none between top-level packages), function-level imports of them stay
few and each says why, and no test module imports another (shared helpers live in conftest fixtures).

An import counts at module level and inside functions; ``if TYPE_CHECKING:`` blocks are skipped.
``from pkg import name`` counts as an import of the submodule that defines ``name``: a package's
``_WHERE`` table (``yxanul._lazy``) names it, otherwise the package's ``__init__`` itself."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Function-level imports of yxanul modules: only where one keeps `yxanul X --help`, config errors or
# `import yxanul` free of torch/transformers/TE, each with its reason on the line.
MAX_FUNCTION_LEVEL = 31


def _modules(root: Path, top: str) -> dict[str, Path]:
    out = {}
    for p in sorted((root / top).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """A package's ``_WHERE = {public name: submodule}`` (the lazy exports), else {}."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)}
    return {}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING"


def _imports(tree: ast.Module):
    """(node, inside a function) for every import statement, TYPE_CHECKING blocks aside."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for c in child.orelse:
                    yield from walk(c, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from walk(tree, False)


class Graph:
    """Module -> the yxanul modules it imports; the function-level ones with their line."""

    def __init__(self, root: Path = ROOT, top: str = "yxanul"):
        self.top = top
        self.files = _modules(root, top)
        trees = {m: ast.parse(p.read_text(), str(p)) for m, p in self.files.items()}
        self.lazy = {m: _lazy_table(t) for m, t in trees.items() if self.files[m].name == "__init__.py"}
        self.edges: dict[str, set[str]] = defaultdict(set)
        self.function_level: list[tuple[str, int, str]] = []  # (module, line, the source line)
        for m, tree in trees.items():
            lines = self.files[m].read_text().splitlines()
            for node, in_function in _imports(tree):
                targets = self._targets(m, node) - {m}
                self.edges[m] |= targets
                if in_function and targets:
                    self.function_level.append((m, node.lineno, lines[node.lineno - 1].strip()))

    def _module_of(self, name: str) -> str | None:
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def _targets(self, module: str, node) -> set[str]:
        if isinstance(node, ast.Import):
            return {t for a in node.names if (t := self._module_of(a.name)) and a.name.split(".")[0] == self.top}
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if self.files[module].name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
        if base.split(".")[0] != self.top:
            return set()
        out = set()
        for a in node.names:
            if f"{base}.{a.name}" in self.files:  # from pkg import submodule
                out.add(f"{base}.{a.name}")
            elif a.name in self.lazy.get(base, {}):  # from pkg import name, defined in pkg.<where>
                out.add(f"{base}.{self.lazy[base][a.name]}")
            elif (t := self._module_of(base)) is not None:
                out.add(t)
        return out

    def packages(self) -> dict[str, set[str]]:
        """Top-level package (or module) -> those it imports; ``yxanul/__init__`` and its helpers aside."""
        def top(m):
            return ".".join(m.split(".")[:2])
        out: dict[str, set[str]] = defaultdict(set)
        for a, bs in self.edges.items():
            out[top(a)] |= {top(b) for b in bs if top(b) != top(a) and top(b) != self.top}
        return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    assert cycles(Graph().edges) == []


def test_no_import_cycle_between_top_level_packages():
    assert cycles(Graph().packages()) == []


def test_function_level_imports_are_few_and_each_says_why():
    graph = Graph()
    assert len(graph.function_level) <= MAX_FUNCTION_LEVEL, "\n".join(
        f"{m}:{line} {src}" for m, line, src in graph.function_level)
    unexplained = [f"{m}:{line} {src}" for m, line, src in graph.function_level if "#" not in src]
    assert unexplained == [], "\n".join(unexplained)


def test_the_checker_sees_a_back_import(tmp_path):
    """A module-level import hidden in a function, through a lazy package export, still makes a cycle."""
    pkg = tmp_path / "yxanul"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from .low import helper\n")
    (pkg / "low" / "__init__.py").write_text('_WHERE = {"helper": "impl"}\n')
    (pkg / "low" / "impl.py").write_text("def helper():\n    from ..high import x  # back up\n")
    graph = Graph(tmp_path)
    assert graph.edges["yxanul.high"] == {"yxanul.low.impl"}
    assert cycles(graph.edges) == [["yxanul.high", "yxanul.low.impl"]]
    assert cycles(graph.packages()) == [["yxanul.high", "yxanul.low"]]
    assert graph.function_level == [("yxanul.low.impl", 2, "from ..high import x  # back up")]


def _test_imports(tests: Path = ROOT / "tests") -> list[str]:
    """``a imports b`` for every test module (``test_*.py``) that imports another one, by its path under
    tests/ or by the bare name pytest's default import mode puts on sys.path (``from test_x import``)."""
    files = sorted(tests.rglob("*.py"))
    names = {}  # importable name -> test module path
    for p in files:
        if p.name.startswith("test_"):
            rel = p.relative_to(tests).with_suffix("").parts
            for i in range(len(rel)):
                names[".".join(rel[i:])] = str(p.relative_to(tests))
    bad = []
    for p in files:
        for node, _ in _imports(ast.parse(p.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad += [f"{p.relative_to(tests)} imports {names[m]}" for m in mods if m in names]
    return bad


def test_no_test_module_imports_another():
    """Shared test helpers are conftest fixtures (or helper modules that are not tests themselves)."""
    assert _test_imports() == []


def test_the_test_checker_sees_a_bare_name_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "test_a.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "test_b.py").write_text("def test_b():\n    from test_a import X\n")
    (tmp_path / "pkg" / "helpers.py").write_text("from pkg.test_b import test_b\n")
    assert _test_imports(tmp_path) == ["pkg/helpers.py imports pkg/test_b.py", "pkg/test_b.py imports test_a.py"]
