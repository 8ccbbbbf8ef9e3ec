"""The suite's parallel workers (pytest-xdist, `make test`) keep what tests share apart: an inner pytest
session with tests/conftest.py and 2 workers runs every Slurm test (the `cluster` fixture or the `slurm`
marker) in one worker, every user of a module-scoped fixture in one worker (the fixture built once), and
spreads the other tests over both workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SLURM_MODULE = """
import json, os
import pytest

def _note(tmp_path_factory, name):
    with open(os.path.join(os.environ["NOTES"], name), "w") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "none"))

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _note(tmp_path_factory, "built-" + os.environ.get("PYTEST_XDIST_WORKER", "none"))
    return 1

@pytest.mark.parametrize("i", range(6))
def test_marked(tmp_path_factory, i):
    _note(tmp_path_factory, f"slurm-marked-{i}")

@pytest.mark.parametrize("i", range(6))
def test_with_the_cluster_fixture(tmp_path_factory, i, monkeypatch):
    _note(tmp_path_factory, f"slurm-fixture-{i}")

@pytest.mark.parametrize("i", range(6))
def test_shared_set_up(tmp_path_factory, built, i):
    _note(tmp_path_factory, f"module-{i}")

@pytest.mark.parametrize("i", range(12))
def test_free(tmp_path_factory, i):
    import time
    time.sleep(0.2)  # long enough that both workers take some
    _note(tmp_path_factory, f"free-{i}")
"""


WRITE = "def write_groups(path: str, groups: dict[str, str]) -> None:\n"
SLOW = WRITE + "    import time\n    time.sleep(1.5)  # a worker slow to write: the controller must still wait for it\n"
TRYFIRST = "@pytest.hookimpl(tryfirst=True)\ndef pytest_collection_finish(session):"


def _inner_suite(tmp_path, conftest_change=None):
    """The real conftest (its `cluster` fixture a no-op: the grouping is by the fixture's name) and
    helpers, each worker's groups file written 1.5 s late, and SLURM_MODULE; run with 2 workers."""
    suite = tmp_path / "suite"
    suite.mkdir()
    conftest = (TESTS / "conftest.py").read_text()
    assert "    require_cluster()\n" in conftest and TRYFIRST in conftest
    conftest = conftest.replace("    require_cluster()\n", "    pass\n")
    if conftest_change is not None:
        conftest = conftest_change(conftest)
    (suite / "conftest.py").write_text(conftest)
    shutil.copytree(TESTS / "helpers", suite / "helpers")
    groups = suite / "helpers" / "worker_groups.py"
    assert WRITE in groups.read_text()
    groups.write_text(groups.read_text().replace(WRITE, SLOW))
    module = SLURM_MODULE.replace("def test_marked(", "@pytest.mark.slurm\ndef test_marked(")
    module = module.replace("(tmp_path_factory, i, monkeypatch)", "(tmp_path_factory, i, cluster)")
    (suite / "test_groups.py").write_text(module)
    (suite / "pytest.ini").write_text("[pytest]\npythonpath = .\naddopts = --dist loadgroup\n")
    notes_dir = tmp_path / "notes"
    notes_dir.mkdir()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                          f"--basetemp={tmp_path / 'bt'}", str(suite)], cwd=suite, capture_output=True, text=True,
                         env=dict(os.environ, NOTES=str(notes_dir)))
    return run, notes_dir


def test_slurm_tests_and_module_fixture_users_stay_in_one_worker_each(tmp_path):
    run, notes_dir = _inner_suite(tmp_path)
    assert run.returncode == 0 and "30 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    notes = {p.name: p.read_text() for p in notes_dir.iterdir()}
    workers = {k: v for k, v in notes.items() if not k.startswith("built-")}
    slurm = {v for k, v in workers.items() if k.startswith("slurm-")}
    module = {v for k, v in workers.items() if k.startswith("module-")}
    free = {v for k, v in workers.items() if k.startswith("free-")}
    assert len(slurm) == 1 and len(module) == 1, json.dumps(notes)
    assert [k for k in notes if k.startswith("built-")] == [f"built-{module.pop()}"]  # built once
    assert free == {"gw0", "gw1"}, json.dumps(notes)  # the others are spread


def test_groups_reported_after_the_collection_stop_the_run_not_the_grouping(tmp_path):
    """Without tryfirst, xdist's hook reports a worker's collection before the groups file is written (the
    race that once spread the Slurm tests over two workers): the scheduler refuses, the run fails loudly."""
    run, notes_dir = _inner_suite(tmp_path, lambda c: c.replace(TRYFIRST, "def pytest_collection_finish(session):"))
    assert run.returncode != 0, run.stdout[-3000:]
    assert "reported its collection before writing" in run.stdout + run.stderr, run.stdout[-3000:] + run.stderr[-3000:]
    assert not any(notes_dir.iterdir())  # no test ran ungrouped
