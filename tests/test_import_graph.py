"""The import graph of reshardctl/, read from the AST of every module (module-level and function-local
imports alike; an import under ``if TYPE_CHECKING:`` never runs and is left out): no import circles, and
no module outside ``reshardctl/commands/`` and ``reshardctl/cli.py`` imports ``reshardctl.commands``.

The known exceptions are listed below with their reason; the lists can only shrink (an exception that
no longer occurs fails the test until its line is deleted)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "reshardctl"

# circles still in the tree, each as the set of modules of one strongly connected component
KNOWN_CIRCLES: list[frozenset[str]] = [
]

# (importer, imported) arrows into reshardctl.commands from outside it
KNOWN_COMMANDS_IMPORTS: set[tuple[str, str]] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: they never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for stmt in node.body:
                out |= {id(n) for n in ast.walk(stmt)}
    return out


@functools.lru_cache(maxsize=None)
def import_graph(package: Path = PACKAGE) -> dict[str, frozenset[str]]:
    """module -> the modules of ``package`` it imports (a package's ``__init__`` is the package's name)."""
    files = {module_name(p, package.parent): p for p in package.rglob("*.py")}
    graph: dict[str, frozenset[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package
                    pkg = name.split(".") if is_package else name.split(".")[:-1]
                    pkg = pkg[:len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = []
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in files else base)
            else:
                continue
            for t in targets:
                # `import reshardctl.a.b` names the module itself; keep the longest prefix that is one
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = frozenset(deps)
    return graph


def strongly_connected(graph) -> list[frozenset[str]]:
    """Tarjan's algorithm (iterative): the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


def test_the_reader_sees_every_kind_of_import(tmp_path):
    """Module-level, function-local, relative and submodule imports are arrows; TYPE_CHECKING ones are
    not; and a circle among them is found (a reader that found nothing would pass everything)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import c\n")
    (pkg / "a.py").write_text("import pkg.b\nimport os\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nfrom .. import a\n"
                                      "if TYPE_CHECKING:\n    from pkg import d\n")
    (pkg / "d.py").write_text("from pkg.sub.c import x\n")
    g = import_graph(pkg)
    assert g == {"pkg": set(), "pkg.sub": {"pkg.sub.c"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"},
                 "pkg.sub.c": {"pkg.a"}, "pkg.d": {"pkg.sub.c"}}
    assert strongly_connected(g) == [frozenset({"pkg.a", "pkg.b", "pkg.sub.c"})]


def test_no_import_circles():
    found = set(strongly_connected(import_graph()))
    new = found - set(KNOWN_CIRCLES)
    assert not new, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = set(KNOWN_CIRCLES) - found
    assert not gone, "no longer circles, delete them from KNOWN_CIRCLES: " + "; ".join(" <-> ".join(sorted(c)) for c in gone)


def test_only_cli_and_commands_import_commands():
    arrows = {(m, d) for m, deps in import_graph().items() for d in deps
              if (d == "reshardctl.commands" or d.startswith("reshardctl.commands."))
              and not (m == "reshardctl.cli" or m == "reshardctl.commands" or m.startswith("reshardctl.commands."))}
    new = arrows - KNOWN_COMMANDS_IMPORTS
    assert not new, f"modules outside commands/ and cli.py import commands/: {sorted(new)}"
    gone = KNOWN_COMMANDS_IMPORTS - arrows
    assert not gone, f"no longer imported, delete them from KNOWN_COMMANDS_IMPORTS: {sorted(gone)}"
