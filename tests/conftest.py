"""Shared test fixtures."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers import gpu_marks, worker_groups
from helpers.slurm_cluster import require_cluster
from helpers.small_llama import SMALL_LLAMA


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory, monkeypatch):
    """Calibration files live in $XDG_STATE_HOME/reshardctl/: every test gets an empty one, so no
    test reads (or writes) the user's calibrations."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def _no_default_site(tmp_path_factory, monkeypatch):
    """The default site (site/default_site.py: RESHARDCTL_SITE, then $XDG_CONFIG_HOME/reshardctl/config.toml)
    is the test's own: none unless the test sets one, whatever the developer's shell or config says."""
    monkeypatch.delenv("RESHARDCTL_SITE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


@pytest.fixture
def small_llama(tmp_path) -> str:
    """Path of the small llama's config.json (its own directory)."""
    d = tmp_path / "small"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMALL_LLAMA))
    return str(d / "config.json")


@pytest.fixture(scope="module")
def cluster():
    """The local Slurm cluster (tests/slurm/cluster-up.sh): the test skips without one, or fails under
    RESHARDCTL_REQUIRE_SLURM=1."""
    require_cluster()


# ---- backends: CPU tests run gloo on any host; GPU (NCCL) tests only when asked ---------------------
GPU_FLAG = "RESHARDCTL_TEST_GPU"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA (one device unless marked gpus(n)); runs only with "
                                       "RESHARDCTL_TEST_GPU=1 (make test-gpu, make test-gpu-one)")
    config.addinivalue_line("markers", "gpus(n): a gpu test that needs n CUDA devices (one NCCL rank per device); "
                                       "skipped with 'needs n GPUs, found k' on fewer; n >= 2 also marks it multi_gpu")
    config.addinivalue_line("markers", "multi_gpu: set by the gpus(n >= 2) mark: not runnable on one GPU "
                                       "(make test-gpu-one deselects it)")
    config.addinivalue_line("markers", f"slurm: uses the local Slurm cluster; under pytest-xdist every such test runs in "
                                       f"one worker, one at a time (the group {SLURM_GROUP!r}, see below)")


# ---- parallel workers (pytest-xdist, `make test`: -n with --dist loadgroup) --------------------------
# Tests run in several worker processes; a test leaves its worker only through what it shares:
# * the local Slurm cluster (4 nodes, one accounting): every test that submits to it (the `cluster`
#   fixture or the `slurm` marker) runs in the group SLURM_GROUP, one after the other in one worker, so
#   no job waits in the queue behind another test's and the timing bounds stay the run's own;
# * a module-scoped fixture (a spawned world measured once and read by several tests): the tests that
#   use one run in their module's group, so it is built once, not once per worker.
# Everything else a test touches is its own: tmp_path, XDG_STATE_HOME (above), ports from the OS,
# environment changes through monkeypatch (per process). The groups reach the scheduler through
# helpers/worker_groups.py (xdist's own loadgroup loses them under pytest 9.2).
SLURM_GROUP = "slurm"
# module-scoped but cheap, nothing worth sharing: the check that the cluster answers, a small plan
# (test_commit_protocol.py, bind/test_binding_checks.py), a one-layer model and its layout (test_input_fuzz.py)
FREE_MODULE_FIXTURES = {"cluster", "plan", "llama_plan", "tiny", "exported"}
GROUP = pytest.StashKey[str]()
GROUPS_DIR = pytest.StashKey[Path]()


def _worker_group(item) -> str | None:
    if item.get_closest_marker("slurm") is not None or "cluster" in item.fixturenames:
        return SLURM_GROUP
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        if name not in FREE_MODULE_FIXTURES and defs and defs[-1].scope in ("module", "package", "class"):
            return f"module:{item.path.relative_to(item.config.rootpath)}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """On a worker: write the groups of what it collected where the controller reads them, before
    xdist's own hook reports the collection (the controller schedules as soon as every worker reported;
    without tryfirst xdist's hook, registered later, runs first and the controller can read no file)."""
    path = getattr(session.config, "workerinput", {}).get(worker_groups.GROUPS_KEY)
    if path is not None:
        worker_groups.write_groups(path, {item.nodeid: item.stash[GROUP] for item in session.items
                                          if item.stash.get(GROUP, None) is not None})


def pytest_configure_node(node):
    """On the controller, for each worker it starts: the file the worker writes its groups to."""
    config = node.config
    if GROUPS_DIR not in config.stash:
        config.stash[GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="reshardctl-test-groups-"))
    node.workerinput[worker_groups.GROUPS_KEY] = str(config.stash[GROUPS_DIR] / f"{node.gateway.id}.json")


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        return worker_groups.GroupScheduling(config, log, groups_dir=config.stash.get(GROUPS_DIR, None))
    return None


def pytest_unconfigure(config):
    if GROUPS_DIR in config.stash:
        shutil.rmtree(config.stash[GROUPS_DIR], ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: multi_gpu is set here, from gpus(n)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.stash[GROUP] = _worker_group(item)
        if item.get_closest_marker("gpu") is not None and gpu_marks.needed_gpus(item) >= 2:
            item.add_marker(pytest.mark.multi_gpu)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if os.environ.get(GPU_FLAG) != "1":
        skip = pytest.mark.skip(reason=f"GPU test: set {GPU_FLAG}=1 (make test-gpu, make test-gpu-one)")
        for item in gpu_items:
            item.add_marker(skip)
        return
    if not gpu_items:
        return
    found, cuda = gpu_marks.visible_gpus()
    for item in gpu_items:
        why = gpu_marks.skip_reason(gpu_marks.needed_gpus(item), found, cuda)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(autouse=True)
def _pin_backend(request, monkeypatch):
    """Every test that is not marked gpu runs its ranks on gloo/CPU, even on a host with GPUs."""
    if "gpu" not in request.keywords:
        monkeypatch.setenv("RESHARDCTL_FORCE_CPU", "1")
