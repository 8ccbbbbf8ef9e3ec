"""docs/architecture.md's module tree lists every module of the package by its full path, and names no
path that does not exist.

The tree is the fenced block that starts with the line ``reshardctl/``: a package is a line ``  pkg/`` (two
spaces), a module of it a line ``    module.py`` (four spaces) below it, a top-level module a line
``  module.py`` (two spaces); the text after the name, and continuation lines, are descriptions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"^(?P<indent> {2}| {4})(?P<name>[A-Za-z0-9_]+(?:\.py|/))(?:\s|$)")


def tree_paths(doc: str) -> list[str]:
    """The paths the module tree names, relative to the repository (``reshardctl/plan/planner.py``)."""
    lines = doc.splitlines()
    start = lines.index("reshardctl/")
    assert lines[start - 1].startswith("```"), "the module tree is not a fenced block"
    paths: list[str] = []
    package: str | None = None
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("```"):
            return paths
        m = ENTRY.match(line)
        if m is None:
            continue  # a description's continuation line
        name, depth = m["name"], len(m["indent"]) // 2
        if depth == 1 and name.endswith("/"):
            package = name
            paths.append(f"reshardctl/{name}")
        elif depth == 1:
            package = None  # a top-level module ends the package above it
            paths.append(f"reshardctl/{name}")
        else:
            if package is None:
                raise AssertionError(f"docs/architecture.md line {number}: module {name} under no package")
            paths.append(f"reshardctl/{package}{name}")
    raise AssertionError("the module tree's fenced block never ends")


def package_paths(root: Path) -> set[str]:
    """Every module (``__init__.py`` left out: packages are their own lines) and every package directory."""
    pkg = root / "reshardctl"
    out = {p.relative_to(root).as_posix() for p in pkg.rglob("*.py") if p.name != "__init__.py"}
    out |= {p.parent.relative_to(root).as_posix() + "/" for p in pkg.rglob("__init__.py") if p.parent != pkg}
    return out


def test_every_module_is_listed_by_full_path_and_every_listed_path_exists():
    listed = tree_paths((ROOT / "docs" / "architecture.md").read_text())
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({p for p in listed if listed.count(p) > 1})}"
    have = package_paths(ROOT)
    assert sorted(have - set(listed)) == [], "modules missing from docs/architecture.md's module tree"
    assert sorted(set(listed) - have) == [], "docs/architecture.md's module tree lists paths that do not exist"


@pytest.mark.parametrize("tree, problem", [
    # a module listed under the wrong package: its file name exists, its path does not
    ("reshardctl/\n  plan/\n    worker.py   one rank\n", {"reshardctl/plan/worker.py"}),
    # a top-level module indented as a package's module
    ("reshardctl/\n  plan/\n    cli.py      the app\n", {"reshardctl/plan/cli.py"}),
])
def test_a_module_under_the_wrong_package_is_found(tree, problem):
    """The check is by full path: the file NAME alone (worker.py exists in runtime/) is not enough."""
    listed = set(tree_paths(f"# map\n\n```\n{tree}```\n"))
    assert listed - package_paths(ROOT) == problem


def test_continuation_lines_and_top_level_modules_parse():
    doc = ("```\nreshardctl/\n  cli.py                the app\n  plan/\n    planner.py          build_plan\n"
           "                        (a continuation line, not a module.py)\n  topology.py           ranks\n```\n")
    assert tree_paths(doc) == ["reshardctl/cli.py", "reshardctl/plan/", "reshardctl/plan/planner.py",
                               "reshardctl/topology.py"]
