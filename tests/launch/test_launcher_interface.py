"""One launcher interface (launch/launcher.py): the session code never names or imports a launcher,
no arrow runs from launch/ back up to the session, the registry maps every profile's launcher name,
and the dry run belongs to the launcher (printable, nothing written)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reshardctl.errors import InputError
from reshardctl.launch.launcher import LAUNCHERS, DryRun, launcher_for, launcher_of_run
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare
from reshardctl.site.spec import LAUNCHERS as PROFILE_LAUNCHERS

PKG = Path(__file__).resolve().parents[2] / "reshardctl"
LAUNCHER_MODULES = ("reshardctl.launch.local", "reshardctl.launch.local_launcher", "reshardctl.launch.slurm",
                    "reshardctl.launch.slurm_launcher", "reshardctl.launch.slurm_request")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _compared_names(path: Path) -> list[str]:
    """String constants compared with == / != / in (a code path chosen by a name), with their line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                for c in ast.walk(part):
                    if isinstance(c, ast.Constant) and c.value in ("local", "slurm"):
                        found.append(f"{path.name}:{node.lineno}: {c.value!r}")
    return found


@pytest.mark.parametrize("module", ["session.py", "collect.py"])
def test_the_session_code_names_no_launcher(module):
    path = PKG / "runs" / module
    assert not (_imports(path) & set(LAUNCHER_MODULES)), "runs/ reaches launchers through launch/launcher.py only"
    assert _compared_names(path) == []


def test_no_arrow_from_launch_back_to_the_session():
    for path in (PKG / "launch").glob("*.py"):
        ups = {m for m in _imports(path) if m.startswith(("reshardctl.runs.session", "reshardctl.runs.collect",
                                                           "reshardctl.commands"))}
        assert not ups, f"{path.name} imports {sorted(ups)}"
    # and the session module does not import the collecting one (which builds on it)
    assert not any(m.startswith("reshardctl.runs.collect") for m in _imports(PKG / "runs" / "session.py"))


def test_the_registry_maps_every_profile_launcher():
    assert set(LAUNCHERS) == set(PROFILE_LAUNCHERS)
    for name in LAUNCHERS:
        assert launcher_for(name).name == name
    with pytest.raises(InputError, match=r"--launcher 'pbs': expected one of local, slurm"):
        launcher_for("pbs")


def test_a_run_directory_names_its_launcher(tmp_path):
    assert launcher_of_run(tmp_path).name == "local"  # nothing recorded: a local run
    assert launcher_of_run(tmp_path, job="123").name == "slurm"  # a job submitted by hand for it
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text("{}")
    assert launcher_of_run(tmp_path).name == "slurm"


def test_the_dry_run_belongs_to_the_launcher_and_writes_nothing(tmp_path):
    inp = prepare(RefitRequest(site="slurm-local", model="tiny-llama", train="tp=2", infer="tp=2", transport="reshard"))
    out = tmp_path / "run"
    dry = launcher_for("slurm").dry_run(inp, ["reshard"], out=str(out), mode="two-jobs", baseline=False,
                                        timeout_s=None, retries=0)
    assert isinstance(dry, DryRun) and dry.mode == "two-jobs" and set(dry.scripts) == {"train.sbatch", "infer.sbatch"}
    text = dry.text()
    assert f"# ---- {out}/slurm/train.sbatch\n" in text and text.endswith("infer.sbatch\n")
    assert "# ---- submit (dry run: nothing was submitted or written)\n" in text
    assert dry.to_json()["submit"] == dry.submit and all(a[0] == "sbatch" for a in dry.submit)
    assert not out.exists()
    with pytest.raises(InputError, match="--dry-run is a Slurm launcher option, but the launcher is 'local'"):
        launcher_for("local").dry_run(inp, ["reshard"], out=str(out), mode=None, baseline=False, timeout_s=None,
                                      retries=0)
