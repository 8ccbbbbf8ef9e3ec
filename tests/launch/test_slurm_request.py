"""The Slurm launch request: golden job scripts, the strict renderer, quoting that never executes a value.

Pure tests (no cluster): the scripts are rendered and compared with tests/golden/slurm/; the quoting
tests run the rendered shell lines in a real bash. Regenerate the golden files after an intended change:
``RESHARDCTL_UPDATE_GOLDEN=1 python -m pytest tests/launch/test_slurm_request.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshardctl import __version__
from reshardctl.cli import main
from reshardctl.errors import InputError, LaunchError, ProfileError
from reshardctl.launch.slurm_request import build_request, ranks_command, worker_args
from reshardctl.launch.templates import load_template, render
from reshardctl.site import load_profile
from reshardctl.site.parse import parse_profile
from reshardctl.topology import Topology

GOLDEN = Path(__file__).parent / "golden" / "slurm"
RUN_DIR = "/shared/runs/golden"
PYTHON = "/opt/venv/bin/python"

FULL = {
    "site": "full-options",
    "nodes": "gpu[01-08]",
    "gpus_per_node": 8,
    "launcher": "slurm",
    "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400, "nics_per_node": 8},
    "slurm": {
        "partitions": {"train": "train-h100", "infer": "infer-h100"},
        "account": "rl-team",
        "qos": "high",
        "time_min": 45,
        "constraint": "h100&ib",
        "container_image": "nvcr.io#nvidia/nemo-rl:v0.8.0",
        "container_mounts": ["/lustre:/lustre", "/home/me/.cache:/root/.cache"],
        "modules": ["cuda/12.8", "nccl/2.30.7"],
        "env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "^lo,docker", "NCCL_CUMEM_ENABLE": "0"},
        "extra_sbatch": ["--exclusive", "--mem=0"],
        "extra_srun": ["--mpi=pmix", "--cpu-bind=none"],
        "setup": ["source /etc/profile.d/site.sh", "ulimit -l unlimited"],
        "python": "python3",
        "port_min": 8100,
        "port_max": 8899,
    },
    "refit": {"timeout_s": 600, "rendezvous_timeout_s": 300},
}

RESOURCES = {**FULL, "site": "resources", "slurm": {
    **{k: v for k, v in FULL["slurm"].items() if k not in ("extra_sbatch", "container_mounts")},
    "container_mounts": ["/lustre:/lustre", "/home/${USER}/.cache:/root/.cache"],
    "container_expand": True,
    "cpus_per_task": 12, "mem_per_cpu": "8G", "gpus_per_task": 1, "gpu_bind": "closest",
    "signal": "USR1@120", "requeue": False,
    "resources": {"train": {"mem_per_cpu": "16G"}, "infer": {"gpu_bind": "single:1"}},
}}

CASES = {
    "resources-hetjob": (RESOURCES, 16, 8, "hetjob"),
    "resources-two-jobs": (RESOURCES, 16, 8, "two-jobs"),
    # name: (profile, train ranks, infer ranks, mode)
    "slurm-local-hetjob": ("slurm-local", 4, 4, "hetjob"),
    "slurm-local-two-jobs": ("slurm-local", 2, 6, "two-jobs"),
    "full-options-hetjob": (FULL, 16, 8, "hetjob"),
    "full-options-two-jobs": (FULL, 16, 8, "two-jobs"),
    "dgx-h100-deepseek-v3-hetjob": ("dgx-h100", 256, 256, "hetjob"),
}


def _site(spec):
    return load_profile(spec) if isinstance(spec, str) else parse_profile(spec, f"tests/{spec['site']}.yaml")


def _scripts(case: str) -> dict[str, str]:
    spec, t, i, mode = CASES[case]
    site = _site(spec)
    req = build_request(site, Topology.from_site(site, t, i), RUN_DIR, mode=mode, label="reshard", python=PYTHON)
    return {n: text.replace(__version__, "VERSION") for n, text in req.materialize().items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_match_their_golden_files(case):
    scripts = _scripts(case)
    for name, text in scripts.items():
        path = GOLDEN / f"{case}--{name}"
        if os.environ.get("RESHARDCTL_UPDATE_GOLDEN"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.is_file(), f"no golden file {path} (RESHARDCTL_UPDATE_GOLDEN=1 writes it)"
        assert text == path.read_text(), f"{name} of {case} differs from {path}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_are_valid_bash(case):
    for name, text in _scripts(case).items():
        proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, f"{case}/{name}: {proc.stderr}"


def test_het_components_and_resources():
    scripts = _scripts("full-options-hetjob")
    text = scripts["hetjob.sbatch"]
    head, rest = text.split("#SBATCH hetjob\n")
    # component 0 = 16 trainer ranks on 2 nodes of 8, component 1 = 8 inference ranks on 1 node
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=16\n#SBATCH --ntasks-per-node=8" in head
    assert "#SBATCH --partition=train-h100" in head and "#SBATCH --partition=infer-h100" in rest
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks=8\n" in rest
    for flag in ("--account=rl-team", "--qos=high", "--constraint=h100&ib", "--time=45", "--exclusive", "--mem=0"):
        assert f"#SBATCH {flag}" in head and f"#SBATCH {flag}" in rest
    step = next(line for line in text.splitlines() if line.startswith("srun "))
    argv = shlex.split(step)
    assert argv[:2] == ["srun", "--het-group=0,1"]
    assert "--container-image=nvcr.io#nvidia/nemo-rl:v0.8.0" in argv
    # the run directory mounted at its own path (home is not), and the ranks start in it
    assert f"--container-mounts=/lustre:/lustre,/home/me/.cache:/root/.cache,{RUN_DIR}:{RUN_DIR}" in argv
    assert f"--container-workdir={RUN_DIR}" in argv and "--no-container-mount-home" in argv
    assert {"--mpi=pmix", "--cpu-bind=none", "--kill-on-bad-exit=0"} <= set(argv)
    # the profile's python (slurm.python), then the worker on the run's session file
    assert argv[-6:] == ["rank", "python3", "-m", "reshardctl.runtime.worker", "--session", f"{RUN_DIR}/session.pkl"]
    assert "RESHARDCTL_MASTER_PORT=$(( 8100 + (port_draw + try) % 800 ))" in text
    assert "module load cuda/12.8" in text and "ulimit -l unlimited" in text


def test_two_jobs_rendezvous_and_peer_cancel():
    s = _scripts("slurm-local-two-jobs")
    train, infer = s["train.sbatch"], s["infer.sbatch"]
    assert "#SBATCH --ntasks=2" in train and "#SBATCH --ntasks=6" in infer
    assert "--het-group" not in train + infer and "hetjob" not in train + infer
    assert f"peer_file={RUN_DIR}/slurm/infer.jobid" in train and f"peer_file={RUN_DIR}/slurm/train.jobid" in infer
    assert f"mv {RUN_DIR}/slurm/rendezvous.tmp {RUN_DIR}/slurm/rendezvous" in train
    assert f"until [ -s {RUN_DIR}/slurm/rendezvous ]" in infer and '-ge 60 ]' in infer  # rendezvous_timeout_s
    assert "RESHARDCTL_SIDE=train RESHARDCTL_RANK_OFFSET=0" in train
    assert "RESHARDCTL_SIDE=infer RESHARDCTL_RANK_OFFSET=2" in infer


def test_renderer_is_strict():
    with pytest.raises(LaunchError, match="no value for b"):
        render("x {{a}} {{b}}", {"a": "1"})
    with pytest.raises(LaunchError, match="without a placeholder: c"):
        render("x {{a}}", {"a": "1", "c": "2"})
    assert render("{{a}}{{ a }}", {"a": "{{b}}"}) == "{{b}}{{b}}"  # values are not rendered again
    assert "{{ranks}}" in load_template("hetjob.sbatch")


def test_request_refuses_what_cannot_be_carried():
    site = load_profile("slurm-local")
    topo = Topology.from_site(site, 2, 2)
    with pytest.raises(InputError, match="absolute"):
        build_request(site, topo, "runs/x", python=PYTHON)
    with pytest.raises(InputError, match="cannot carry this path"):
        build_request(site, topo, "/tmp/a b", python=PYTHON)
    with pytest.raises(InputError, match="--slurm-mode"):
        build_request(site, topo, "/tmp/x", mode="array", python=PYTHON)


@pytest.mark.parametrize("key,value", [
    ("partition", "debug$(touch /tmp/pwned)"),
    ("partition", "de bug"),
    ("account", "a`id`"),
    ("qos", "q'x"),
    ("constraint", 'c"x'),
    ("partition", "a;b"),
])
def test_sbatch_values_that_a_line_cannot_carry_are_refused(key, value):
    data = dict(FULL, slurm={k: v for k, v in FULL["slurm"].items() if k != "partitions"} | {key: value})
    site = parse_profile(data, "tests/hostile.yaml")
    with pytest.raises(ProfileError, match=rf"hostile.yaml: `slurm\.{key}`"):
        build_request(site, Topology.from_site(site, 8, 8), RUN_DIR, python=PYTHON)


@pytest.mark.parametrize("flag", ["--comment=$(touch x)", "--comment=a b", "--comment=`id`"])
def test_extra_sbatch_flags_that_a_line_cannot_carry_are_refused(flag):
    data = dict(FULL, slurm=dict(FULL["slurm"], extra_sbatch=["--exclusive", flag]))
    site = parse_profile(data, "tests/hostile.yaml")
    with pytest.raises(ProfileError, match=r"`slurm\.extra_sbatch\[1\]`"):
        build_request(site, Topology.from_site(site, 8, 8), RUN_DIR, python=PYTHON)


def test_a_hostile_partition_is_exit_2_on_the_cli(tmp_path, capsys):
    prof = tmp_path / "p.yaml"
    prof.write_text('nodes: n[1-4]\ngpus_per_node: 4\ncpu_only: true\nlinks: {nvlink_gbytes_per_s: 7, '
                    'nic_gbits_per_s: 48}\nslurm: {partition: "debug$(touch x)"}\n')
    code = main(["run", "--site", str(prof), "--model", "tiny-llama", "--layers", "1", "--train", "tp=2",
                 "--infer", "tp=2", "--launcher", "slurm", "--dry-run"])
    assert code == 2
    assert "`slurm.partition`" in capsys.readouterr().err


def test_profile_rejects_newlines_and_nul_where_a_line_is_expected():
    bad = dict(FULL, slurm=dict(FULL["slurm"], setup=["ok", "a\nb"], extra_srun=["--x\n"],
                                env={"A": "x\x00y"}))
    with pytest.raises(ProfileError) as e:
        parse_profile(bad, "tests/bad.yaml")
    msg = str(e.value)
    assert "slurm.setup[1]" in msg and "slurm.extra_srun[0]" in msg and "slurm.env.A" in msg


# --- quoting, in a real bash ------------------------------------------------------------------------

def _prologue(value: str, run_dir: Path) -> str:
    """The whole prologue of a job script whose profile sets HOSTILE=value (no modules or setup lines:
    this machine has no `module`)."""
    slurm = {k: v for k, v in FULL["slurm"].items() if k not in ("modules", "setup")}
    site = parse_profile(dict(FULL, slurm=dict(slurm, env={"HOSTILE": value})), "tests/q.yaml")
    return build_request(site, Topology.from_site(site, 8, 8), str(run_dir), python=PYTHON).prologue


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)
PAYLOADS = ["$(touch {p})", "`touch {p}`", "'; touch {p}; '", '"; touch {p}; "', "a\ntouch {p}", "$((1+1)) ${{HOME}}",
            "\\$(touch {p})", "x' \"$(touch {p})\" '"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT | st.sampled_from(PAYLOADS))
def test_env_values_reach_the_ranks_exactly_and_never_run(value, tmp_path):
    payload = tmp_path / "pwned"
    value = value.replace("{p}", str(payload)) if "{p}" in value else value
    if not value.strip():
        return  # the profile refuses empty values
    prologue = _prologue(value, tmp_path)
    proc = subprocess.run(["bash", "-c", f'{prologue}\nprintf "%s" "$HOSTILE"'], capture_output=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode("utf-8", "surrogateescape") == value
    assert not payload.exists()


def test_the_rank_command_runs_the_named_python_with_a_hostile_path(tmp_path):
    """A python path and run directory holding $(...), backticks, quotes and spaces reach exec intact."""
    payload = tmp_path / "pwned"
    weird = tmp_path / "dir $(touch pwned) `touch pwned` 'q' \"d\" ; touch pwned"  # run from tmp_path
    weird.mkdir()
    py = weird / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "argv"))}\necho out; echo err >&2\n')
    py.chmod(0o755)
    session = str(weird / "session.pkl")
    cmd = ranks_command(str(py), worker_args(session))
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(os.environ, RESHARDCTL_LOGS=str(logs), SLURM_PROCID="3", RESHARDCTL_RANK_OFFSET="4")
    proc = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "argv").read_text().splitlines() == ["-m", "reshardctl.runtime.worker", "--session", session]
    assert (logs / "rank-7.out").read_text() == "out\n" and (logs / "rank-7.err").read_text() == "err\n"
    assert not payload.exists()


def test_only_slurm_commands_run_and_a_missing_one_says_where_to_look(monkeypatch):
    from reshardctl.launch import slurm_cli

    with pytest.raises(LaunchError, match="not a Slurm command"):
        slurm_cli.run(["rm", "-rf", "/"])
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(slurm_cli.SlurmCommandError, match="`squeue` is not on PATH") as e:
        slurm_cli.run(["squeue", "-h"])
    assert e.value.argv == ["squeue", "-h"] and e.value.returncode is None


def test_het_job_nodes_per_side_survive_commas_and_accounting_lag(monkeypatch):
    """A het job's components fold in component order with node lists that may hold commas
    (``n[1,3]``); accounting that has recorded only the first component yet is polled again until the
    second is there (a lag a real cluster shows only now and then: sacct is faked here)."""
    from reshardctl.launch import slurm, slurm_cli

    def st(job, state, nodes):
        return slurm_cli.JobState(job, state, nodes=nodes)

    run = slurm.SlurmRun("/tmp/x", "hetjob", {"het": "12"}, 0.0)
    folded = slurm._fold("12", [st("12+1", "COMPLETED", "n[2,4]"), st("12+0", "COMPLETED", "n[1,3]")])
    w = slurm.Watch({"12": folded}, None, 0.0)
    assert slurm._side_nodes(run, w) == {"train": "n[1,3]", "infer": "n[2,4]"}
    answers = iter([{"12+0": st("12+0", "COMPLETED", "n1")},
                    {"12+0": st("12+0", "COMPLETED", "n1"), "12+1": st("12+1", "COMPLETED", "n2")}])
    monkeypatch.setattr(slurm_cli, "sacct", lambda ids: next(answers))
    monkeypatch.setattr(slurm.time, "sleep", lambda s: None)
    got = slurm.final_states(["12"], wait_s=60, components=run.components())
    assert slurm._side_nodes(run, slurm.Watch(got, None, 0.0)) == {"train": "n1", "infer": "n2"}


# --- the rendezvous port, in a real bash -----------------------------------------------------------------

def _ports(port_min: int, port_max: int, runs: int, job_id: str = "4242") -> list[int]:
    """The port the rendered rendezvous lines choose, ``runs`` times (head node: this machine)."""
    site = parse_profile(dict(FULL, slurm=dict(FULL["slurm"], port_min=port_min, port_max=port_max)), "tests/p.yaml")
    lines = build_request(site, Topology.from_site(site, 8, 8), RUN_DIR, python=PYTHON).rendezvous
    script = f'set -uo pipefail\nfail() {{ echo "$*" >&2; exit 3; }}\nhead_node=localhost\n{lines}\necho "$RESHARDCTL_MASTER_PORT"'
    out = []
    for _ in range(runs):
        proc = subprocess.run(["bash", "-c", script], env={**os.environ, "SLURM_JOB_ID": job_id},
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        out.append(int(proc.stdout))
    return out


def test_the_rendezvous_port_is_random_in_the_range_not_the_job_id():
    ports = _ports(1400, 1999, 12)
    assert all(1400 <= p <= 1999 for p in ports)
    assert len(set(ports)) > 1  # the same job id: another port each time (was 1400 + job id % 600)


def test_the_rendezvous_port_skips_one_a_socket_of_the_node_uses():
    import socket

    # a range of two: a port this test holds and the next; every draw that lands on the held one moves on.
    # The next port is another process's to take meanwhile (the suite runs in parallel): an attempt where a
    # draw came back on the held port counts only if the next one was in use by then too; a script that does
    # not skip comes back on it in about half the draws of every attempt
    for _attempt in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            used = s.getsockname()[1]
            if used >= 65535:
                continue
            got = _ports(used, used + 1, 8)
            if got == [used + 1] * 8:
                return
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", used + 1))
                except OSError:
                    continue  # the next port was taken by someone else: no verdict, try another pair
            pytest.fail(f"draws {got}: port {used} is held, {used + 1} is free")
    pytest.skip("in 3 attempts the port after the held one was always someone else's")


def test_resources_are_rendered_per_het_component_and_job_flags_once():
    text = _scripts("resources-hetjob")["hetjob.sbatch"]
    head, rest = text.split("#SBATCH hetjob\n")
    # the trainer's own memory (slurm.resources.train) over the shared one; the inference binding its own
    assert "#SBATCH --mem-per-cpu=16G" in head and "#SBATCH --mem-per-cpu=8G" in rest
    assert "#SBATCH --gpu-bind=closest" in head and "#SBATCH --gpu-bind=single:1" in rest
    for part in (head, rest):
        assert "#SBATCH --cpus-per-task=12" in part and "#SBATCH --gpus-per-task=1" in part
        assert "--gpus-per-node" not in part  # one GPU per task replaces the per-node request
    # the signal and requeue are the job's: once, in component 0
    assert "#SBATCH --signal=USR1@120" in head and "--signal" not in rest
    assert "#SBATCH --no-requeue" in head and "requeue" not in rest
    step = shlex.split(next(line for line in text.splitlines() if line.startswith("srun ")))
    assert "--cpus-per-task=12" in step  # srun does not inherit it from the job
    train, infer = (_scripts("resources-two-jobs")[n] for n in ("train.sbatch", "infer.sbatch"))
    assert "#SBATCH --signal=USR1@120" in train and "#SBATCH --signal=USR1@120" in infer


def test_a_het_job_with_different_cpus_per_role_is_refused_two_jobs_takes_it():
    spec = {**RESOURCES, "slurm": {**RESOURCES["slurm"], "resources": {"train": {"cpus_per_task": 8}}}}
    site = _site(spec)
    topo = Topology.from_site(site, 16, 8)
    with pytest.raises(ProfileError, match=r"cpus_per_task=8 and the inference tasks 12.*two-jobs"):
        build_request(site, topo, RUN_DIR, mode="hetjob", python=PYTHON)
    two = build_request(site, topo, RUN_DIR, mode="two-jobs", python=PYTHON).materialize()
    assert "--cpus-per-task=8 bash -c" in two["train.sbatch"] and "--cpus-per-task=12 bash -c" in two["infer.sbatch"]


def _mount_flag(site, run_dir=RUN_DIR) -> str:
    text = build_request(site, Topology.from_site(site, 16, 8), run_dir, mode="hetjob", python=PYTHON).materialize()
    step = next(line for line in text["hetjob.sbatch"].splitlines() if line.startswith("srun "))
    return next(w for w in shlex.split(step) if w.startswith("--container-mounts="))


def test_the_run_directory_is_mounted_unless_a_mount_shows_it_already():
    site = _site(FULL)  # /lustre:/lustre, /home/me/.cache:/root/.cache
    assert _mount_flag(site).endswith(f",{RUN_DIR}:{RUN_DIR}")
    assert _mount_flag(site, "/lustre/runs/x") == "--container-mounts=/lustre:/lustre,/home/me/.cache:/root/.cache"
    # a mount to another path inside does not show the run directory at its own path
    moved = _site({**FULL, "slurm": {**FULL["slurm"], "container_mounts": ["/shared:/mnt"]}})
    assert _mount_flag(moved).endswith(f"/shared:/mnt,{RUN_DIR}:{RUN_DIR}")


@pytest.mark.parametrize("mount,problem", [
    ("/home/$USER:/home/$USER", "write it ${NAME}"),
    ("/a,/b", "without commas"),
])
def test_mounts_pyxis_would_misread_are_refused(mount, problem):
    spec = {**FULL, "slurm": {**FULL["slurm"], "container_mounts": [mount]}}
    with pytest.raises(ProfileError, match=re.escape(problem)):
        _site(spec)


@pytest.mark.parametrize("mount", ["/x/$(touch PWNED):/y", "/x/$HOME:/y", "/x/${A:-b}:/y"])
def test_with_container_expand_only_braced_names_expand(mount):
    spec = {**FULL, "slurm": {**FULL["slurm"], "container_mounts": [mount], "container_expand": True}}
    with pytest.raises(ProfileError, match=r"only \$\{NAME\} is expanded"):
        _site(spec)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(literal=st.text(alphabet=st.sampled_from(list("ab/ ;$(){}`'\"\\|&*?~\t")), max_size=12))
def test_an_expanded_mount_word_expands_names_and_nothing_else(literal, tmp_path):
    """The mount word in a real bash: ${USER} and ${HOME} become their values (spaces and all, one word);
    every other character, hostile or not, arrives literally and nothing runs."""
    from reshardctl.launch.slurm_request import shell_word

    text = f"{literal}/home/${{USER}}:{literal}${{HOME}}/x"
    env = {"PATH": os.environ["PATH"], "USER": "a b;$(touch PWNED)", "HOME": "/h *"}
    out = subprocess.run(["bash", "-c", f"set -u; printf '%s\\0' {shell_word(text, expand=True)}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    assert out == f"{literal}/home/{env['USER']}:{literal}{env['HOME']}/x\0"
    assert not (tmp_path / "PWNED").exists()
