"""docs/architecture.md lists every module of the package, and names no module that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_module_is_listed_and_every_listed_module_exists():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc[doc.index("```", doc.index("reshardctl/")):]  # the module tree
    modules = {p.name for p in (ROOT / "reshardctl").rglob("*.py") if p.name != "__init__.py"}
    listed = set(re.findall(r"^\s+([a-z0-9_]+\.py)\s", block, re.M))
    assert modules - listed == set(), "modules missing from docs/architecture.md"
    assert listed - modules == set(), "docs/architecture.md lists modules that do not exist"
