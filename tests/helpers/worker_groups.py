"""Groups of tests that must share one pytest-xdist worker (tests/conftest.py decides which), and the
scheduler that keeps each group in one worker.

pytest-xdist's own ``--dist loadgroup`` passes a test's group to the scheduler by appending ``@group`` to
the test's node id on the worker; since pytest 9.2 (structured node ids) that change is lost and every
test is scheduled on its own, silently (pytest-xdist issue 1386, open at 3.8.0). So the groups travel
explicitly here: every worker writes ``{node id: group}`` of what it collected to a file the controller
named (``pytest_configure_node``), and ``GroupScheduling`` (xdist's load-scope scheduler, one work unit
per group, the largest units first) reads them once all workers have collected, before any test is
handed out. Tests without a group are units of their own."""

from __future__ import annotations

import json
import os
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

GROUPS_KEY = "reshardctl_groups_file"  # in a worker's workerinput: where it writes the groups it collected


def write_groups(path: str, groups: dict[str, str]) -> None:
    """Write ``{node id: group}`` whole (a temporary file renamed) for the controller to read."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(groups, f)
    os.replace(tmp, path)


class GroupScheduling(LoadScopeScheduling):
    """Load-scope scheduling whose scope of a test is its group (read from the workers' files in
    ``groups_dir``), else the test itself."""

    def __init__(self, config, log=None, groups_dir: Path | None = None) -> None:
        super().__init__(config, log)
        self.groups_dir = groups_dir
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # first called by schedule(), after every worker reported its collection
            self._groups = self._read_groups()
        group = self._groups.get(nodeid)
        return nodeid if group is None else f"group:{group}"

    def _read_groups(self) -> dict[str, str]:
        """Every reporting worker's groups. A worker writes its file before it reports its collection
        (tests/conftest.py's ``pytest_collection_finish`` runs first), so a missing file is an error here,
        not a run whose groups are silently lost."""
        groups: dict[str, str] = {}
        if self.groups_dir is None:
            return groups
        for node in sorted(self.registered_collections, key=lambda n: n.gateway.id):
            path = self.groups_dir / f"{node.gateway.id}.json"
            if not path.is_file():
                raise RuntimeError(f"worker {node.gateway.id} reported its collection before writing {path}: "
                                   f"its tests' groups would be lost")
            groups.update(json.loads(path.read_text()))
        return groups
