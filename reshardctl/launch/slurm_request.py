"""A Slurm launch request: pure, printable, and the only place job scripts are composed.

``build_request(site, topology, run_dir, ...)`` turns the site profile's ``slurm:`` section, the two
allocations (trainer ranks, inference ranks; ``topology.py``) and the run options into a
``SlurmRequest``. ``request.materialize()`` renders its job scripts (``sbatch_templates/``, strict
renderer) and ``request.submit_argv(script_path)`` is the argv that submits one. Nothing here probes
the cluster or starts a process (``slurm.py`` submits, ``slurm_cli.py`` runs the commands).

Two modes:

* ``hetjob``: one job with two components (trainer nodes, inference nodes) and one
  ``srun --het-group=0,1`` step: one world, ranks ordered trainers first.
* ``two-jobs``: a trainer job and an inference job, submitted separately (a partition per role). The
  trainer job writes ``slurm/rendezvous`` into the run directory; the inference job waits for it.
  Each job cancels the other when it fails or is cancelled (``slurm/<role>.jobid``).

Quoting: every value that lands in a shell line is ``shlex.quote``-d; values in ``#SBATCH`` lines (read
by sbatch, not by a shell) are refused when they hold whitespace, quotes, ``$``, a backtick, ``;``,
``\\`` or a control character, with the key and the value in the message. ``slurm.setup`` lines are
the one exception by design: they are shell lines the site writes, run as written.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from reshardctl import __version__
from reshardctl.errors import InputError, ProfileError
from reshardctl.launch.templates import load_template, render
from reshardctl.runtime.bounds import srun_wait_s
from reshardctl.runtime.session_file import SESSION_FILE

MODES = ("hetjob", "two-jobs")
ROLE_TEMPLATES = {"hetjob": ("hetjob.sbatch",), "two-jobs": ("train.sbatch", "infer.sbatch")}
_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.,:=/@+%&|!*\[\]()<>#^~{}-]+$")
RENDEZVOUS_FILE = "slurm/rendezvous"
FAIL_MARK = "reshardctl: error: "  # a batch script's own failure line (its fail()); collect quotes it first
INFER_STARTED_FILE = "slurm/infer.started"  # two jobs: the inference job has started (the trainer job waits for it)


@dataclass(frozen=True)
class Component:
    """One allocation: a side of the refit."""

    role: str  # "train" | "infer"
    ranks: int
    nodes: int
    tasks_per_node: int
    partition: str | None


@dataclass(frozen=True)
class SlurmRequest:
    mode: str
    run_dir: str  # absolute, on a filesystem every node sees
    label: str
    components: tuple[Component, ...]
    sbatch: dict  # role -> tuple of "#SBATCH ..." lines
    prologue: str
    srun_flags: str
    ranks_cmd: str
    rendezvous: str
    rendezvous_timeout_s: int
    peer_wait_s: int
    train_world: int
    infer_world: int
    what: str = "refit"  # the scripts' first comment line
    step_flags: dict | None = None  # "hetjob"/"train"/"infer" -> srun flags of that step beyond srun_flags

    @property
    def script_names(self) -> tuple[str, ...]:
        return ROLE_TEMPLATES[self.mode]

    def script_path(self, name: str) -> str:
        return str(PurePosixPath(self.run_dir) / "slurm" / name)

    def materialize(self) -> dict[str, str]:
        """``{script file name: text}``: every script of this request, rendered."""
        common = {
            "version": __version__,
            "what": self.what,
            "run_dir_comment": self.run_dir.replace("\n", " "),
            "train_world": str(self.train_world),
            "infer_world": str(self.infer_world),
            "prologue": self.prologue,
            "rendezvous": self.rendezvous,
            "srun_flags": self.srun_flags,
            "ranks": self.ranks_cmd,
        }
        out = {}
        steps = self.step_flags or {}
        for name in self.script_names:
            values = dict(common)
            key = "hetjob" if name == "hetjob.sbatch" else ("train" if name.startswith("train") else "infer")
            values["srun_flags"] = " ".join(x for x in (self.srun_flags, steps.get(key, "")) if x)
            if name == "hetjob.sbatch":
                values.update(sbatch_train="\n".join(self.sbatch["train"]),
                              sbatch_infer="\n".join(self.sbatch["infer"]))
            else:
                role = "train" if name.startswith("train") else "infer"
                values[f"sbatch_{role}"] = "\n".join(self.sbatch[role])
                peer = "infer" if role == "train" else "train"
                values["peer_file"] = shlex.quote(self.script_path(f"{peer}.jobid"))
                values["rendezvous_file"] = shlex.quote(str(PurePosixPath(self.run_dir) / RENDEZVOUS_FILE))
                values["started_file"] = shlex.quote(str(PurePosixPath(self.run_dir) / INFER_STARTED_FILE))
                if role == "train":
                    values["peer_wait_s"] = str(self.peer_wait_s)
                if role == "infer":
                    values["rendezvous_timeout_s"] = str(self.rendezvous_timeout_s)
                    del values["rendezvous"]
            out[name] = render(load_template(name), values, name=name)
        return out

    def submit_argv(self, name: str, *, after: str | None = None) -> list[str]:
        """The argv that submits script ``name`` (``--parsable``: sbatch prints the job id alone);
        ``after``: a job id this one is held for until it has started (two jobs: the trainer job's)."""
        held = [f"--dependency=after:{after}"] if after is not None else []
        return ["sbatch", "--parsable", *held, self.script_path(name)]


def _sbatch_value(key: str, value: object, source: str) -> str:
    text = str(value)
    if not _SBATCH_SAFE.match(text):
        raise ProfileError(
            f"site profile {source}: `{key}`: {text!r} cannot go into an #SBATCH line: only letters, digits and "
            f"_ . , : = / @ + % & | ! * [ ] ( ) < > # ^ ~ {{ }} - are allowed there (no whitespace, quotes, $, "
            f"backtick, ; or \\); Slurm names and expressions never need them"
        )
    return text


def _run_dir_value(run_dir: str) -> str:
    if not _SBATCH_SAFE.match(run_dir):
        raise InputError(
            f"run directory {run_dir!r}: Slurm's #SBATCH --output line cannot carry this path (whitespace, "
            f"quotes, $, backtick, ; or \\ in it); choose --out with letters, digits, '/', '.', '_' and '-'"
        )
    return run_dir


def _component(role: str, ranks: int, gpus_per_node: int, partition: str | None) -> Component:
    nodes = math.ceil(ranks / gpus_per_node)
    return Component(role, ranks, nodes, min(gpus_per_node, ranks), partition)


def _resource_lines(c: Component, site) -> list[str]:
    """The flags of one component's tasks: CPUs, memory, GPUs and their binding (``RoleResources``)."""
    s, src = site.slurm, site.source
    r = s.role_resources(c.role)
    key = (lambda k: f"slurm.resources.{c.role}.{k}" if c.role in s.resources and getattr(s.resources[c.role], k)
           is not None else f"slurm.{k}")
    lines = []
    if r.cpus_per_task:
        lines.append(f"--cpus-per-task={r.cpus_per_task}")
    if r.mem is not None:
        lines.append(f"--mem={_sbatch_value(key('mem'), r.mem, src)}")
    if r.mem_per_cpu is not None:
        lines.append(f"--mem-per-cpu={_sbatch_value(key('mem_per_cpu'), r.mem_per_cpu, src)}")
    if r.gpus_per_task:  # one GPU per task (CUDA_VISIBLE_DEVICES holds it: runtime/device.py uses device 0)
        lines.append(f"--gpus-per-task={r.gpus_per_task}")
    elif s.gpus_per_node:
        lines.append(f"--gpus-per-node={s.gpus_per_node}")
    if r.gpu_bind:
        lines.append(f"--gpu-bind={_sbatch_value(key('gpu_bind'), r.gpu_bind, src)}")
    return lines


def _job_lines(site) -> list[str]:
    """Flags of the whole job (a het job's first component; each job of two): the signal, requeue."""
    s = site.slurm
    lines = []
    if s.signal:  # to the steps' tasks, the ranks (no B:): runtime/time_limit.py ends the refit cleanly
        lines.append(f"--signal={_sbatch_value('slurm.signal', s.signal, site.source)}")
    if s.requeue is not None:
        lines.append("--requeue" if s.requeue else "--no-requeue")
    return lines


def _sbatch_lines(c: Component, site, job_name: str, output: str | None, job: bool = True) -> tuple[str, ...]:
    s = site.slurm
    src = site.source
    lines = []
    if job_name:
        lines.append(f"--job-name={_sbatch_value('job name', job_name, src)}")
    if output:
        lines.append(f"--output={output}")
    if c.partition:
        key = "slurm.partitions." + c.role if len(set(s.partitions.values())) > 1 else "slurm.partition"
        lines.append(f"--partition={_sbatch_value(key, c.partition, src)}")
    lines += [f"--nodes={c.nodes}", f"--ntasks={c.ranks}", f"--ntasks-per-node={c.tasks_per_node}"]
    lines += _resource_lines(c, site)
    lines.append(f"--time={s.time_min}")
    if job:
        lines += _job_lines(site)
    for key in ("account", "qos", "constraint"):
        v = getattr(s, key)
        if v:
            lines.append(f"--{key}={_sbatch_value('slurm.' + key, v, src)}")
    lines += [_sbatch_value(f"slurm.extra_sbatch[{i}]", f, src) for i, f in enumerate(s.extra_sbatch)]
    return tuple(f"#SBATCH {x}" for x in lines)


def _prologue(site, run_dir: str, mode: str) -> str:
    s = site.slurm
    q = shlex.quote
    lines = ["umask 077  # every file and directory of the run (logs, rendezvous) private to the user"]
    if mode == "two-jobs":
        lines += [
            "# the other job of this refit ($peer_file): cancelled when this one fails or is cancelled",
            'cancel_peer() { local id; id=$(cat "$peer_file" 2>/dev/null) || return 0; '
            '[ -n "$id" ] && scancel "$id" 2>/dev/null; return 0; }',
            "trap 'cancel_peer; exit 143' TERM INT",
        ]
    else:
        lines.append("cancel_peer() { :; }  # one job: Slurm ends both components together")
    lines.append(f'fail() {{ echo "{FAIL_MARK}$*" >&2; cancel_peer; exit 3; }}')
    if s.modules:
        lines.append("set +u  # module (Lmod, Environment Modules) may read unset variables")
        for m in s.modules:
            lines.append(f"module load {q(m)} || fail {q('module load ' + m + ' failed')}")
        lines.append("set -u")
    for name, value in s.env.items():  # names are checked shell names (profile parser)
        lines.append(f"export {name}={q(value)}")
    if s.signal:
        lines.append(f"export RESHARDCTL_STOP_SIGNAL={s.signal.split('@')[0]}  # slurm.signal: the ranks stop "
                     "cleanly on it (runtime/time_limit.py)")
    if site.cpu_only:
        lines.append("export RESHARDCTL_FORCE_CPU=1  # cpu_only site: gloo on CPU whatever GPUs Slurm hands out")
    lines.append(f"export RESHARDCTL_LOGS={q(str(PurePosixPath(run_dir) / 'logs'))}")
    lines.append('mkdir -p "$RESHARDCTL_LOGS"')
    lines.append(f"cd {q(run_dir)} || fail 'cannot enter the run directory'")
    if s.setup:
        lines.append("# slurm.setup: the site's own shell lines, as written in the profile")
        lines.append("set +u  # (activate scripts and the like may read unset variables)")
        lines += list(s.setup)
        lines.append("set -u")
    return "\n".join(lines)


PORT_TRIES = 8


def _rendezvous(site) -> str:
    s = site.slurm
    span = s.port_max - s.port_min + 1
    return "\n".join([
        'RESHARDCTL_MASTER_ADDR=$(getent ahostsv4 "$head_node" | awk \'NR == 1 { print $1 }\')',
        'if [ -z "$RESHARDCTL_MASTER_ADDR" ]; then  # a node name that does not resolve: ask Slurm for its address',
        '  RESHARDCTL_MASTER_ADDR=$(scontrol show node "$head_node" | tr \' \' \'\\n\' | sed -n \'s/^NodeAddr=//p\' | head -n 1)',
        "fi",
        '[ -n "$RESHARDCTL_MASTER_ADDR" ] || fail "no address for node $head_node"',
        f"# a random port in slurm.port_min..port_max ({s.port_min}..{s.port_max}) from /dev/urandom; the next",
        f"# ones (up to {PORT_TRIES} in all) while a socket of this node (the batch host: the head node) uses it",
        "port_used() { { cat /proc/net/tcp /proc/net/tcp6 2>/dev/null || :; } | awk -v p=\"$(printf '%04X' \"$1\")\" "
        "'$1 != \"sl\" { split($2, a, \":\"); if (a[2] == p) f = 1 } END { exit !f }'; }",
        "port_draw=$(od -An -N4 -tu4 /dev/urandom)",
        f"for try in $(seq 0 {PORT_TRIES - 1}); do",
        f"  RESHARDCTL_MASTER_PORT=$(( {s.port_min} + (port_draw + try) % {span} ))",
        '  port_used "$RESHARDCTL_MASTER_PORT" || break',
        "done",
        "export RESHARDCTL_MASTER_ADDR RESHARDCTL_MASTER_PORT",
    ])


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def shell_word(text: str, expand: bool = False) -> str:
    """``text`` as one shell word. ``expand``: each ``${NAME}`` is left to the shell, double-quoted (no word
    splitting, no globbing); every other character is single-quoted, so ``$(...)``, backticks, ``;`` and a
    bare ``$`` stay literal."""
    if not expand:
        return shlex.quote(text)
    parts, at = [], 0
    for m in _VAR.finditer(text):
        if m.start() > at:
            parts.append(shlex.quote(text[at:m.start()]))
        parts.append(f'"${{{m.group(1)}}}"')
        at = m.end()
    if at < len(text) or not parts:
        parts.append(shlex.quote(text[at:]))
    return "".join(parts)


def _mount_covers(mount: str, path: str) -> bool:
    """A ``src:dst[:flags]`` (or ``path``) mount that shows ``path`` at the same path inside."""
    src, _, rest = mount.partition(":")
    dst = rest.partition(":")[0] or src
    return src == dst and (path == src or path.startswith(src.rstrip("/") + "/"))


def container_mounts(site, run_dir: str) -> list[str]:
    """The profile's mounts, and the run directory (session file, reports, logs) at its own path unless one
    of them shows it already: the ranks read and write it inside the container, home or not."""
    mounts = list(site.slurm.container_mounts)
    if not any(_mount_covers(m, run_dir) for m in mounts):
        mounts.append(f"{run_dir}:{run_dir}")
    return mounts


def _srun_flags(site, wait_s: int, run_dir: str) -> str:
    s = site.slurm
    q = shlex.quote
    # survivors of a failed rank report it themselves (--kill-on-bad-exit=0); --wait ends the step
    # wait_s after its first task ended: the ranks still running then are hung or stopped
    flags = ["--kill-on-bad-exit=0", f"--wait={wait_s}"]
    if s.container_image:
        flags.append(q(f"--container-image={s.container_image}"))
        flags.append(shell_word("--container-mounts=" + ",".join(container_mounts(site, run_dir)),
                                s.container_expand))
        flags.append(q(f"--container-workdir={run_dir}"))
        # the run directory is mounted above: the home directory is not needed (nor shown)
        flags.append("--no-container-mount-home")
    flags += [q(f) for f in s.extra_srun]
    return " ".join(flags)


def _step_flags(site, mode: str) -> dict[str, str]:
    """``--cpus-per-task`` again on each step: srun does not inherit it from the job (Slurm >= 22.05). A het
    job's one step takes one value, so both roles must ask the same (else: two-jobs)."""
    s = site.slurm
    cpus = {role: s.role_resources(role).cpus_per_task for role in ("train", "infer")}
    if mode == "two-jobs":
        return {role: f"--cpus-per-task={n}" for role, n in cpus.items() if n}
    if cpus["train"] != cpus["infer"]:
        raise ProfileError(
            f"site profile {site.source}: `slurm.resources`: the trainer tasks ask cpus_per_task={cpus['train']} and "
            f"the inference tasks {cpus['infer']}, but a het job's one step (srun --het-group=0,1) takes one "
            f"--cpus-per-task (srun does not inherit it from the job): give both roles the same value, or use "
            f"slurm.mode: two-jobs (a step per job)")
    return {"hetjob": f"--cpus-per-task={cpus['train']}"} if cpus["train"] else {}


def worker_args(session_path: str) -> list[str]:
    """The refit worker on a session file: what each task of a refit runs after ``python``."""
    return ["-m", "reshardctl.runtime.worker", "--session", session_path]


def ranks_command(python: str, args: list[str]) -> str:
    """Each task: ``python args...``, its stdout/stderr in ``logs/rank-<global rank>.{out,err}``, and,
    once the process ended however it ended (a SIGKILL too), its exit status in ``logs/rank-<global
    rank>.exit``: the ranks waiting for reports know at once that this one is gone
    (``runtime/report_wait.py``). The wrapper outlives a time-limit signal (``trap : USR1 USR2``; the
    rank itself gets the signal with its default action, which ``runtime/time_limit.py`` replaces). The bash string is constant; ``python`` and the arguments travel as
    quoted arguments."""
    redirect = ('trap : USR1 USR2; r=$((${RESHARDCTL_RANK_OFFSET:-0} + SLURM_PROCID)); '
                '"$@" >"$RESHARDCTL_LOGS/rank-$r.out" 2>"$RESHARDCTL_LOGS/rank-$r.err"; '
                'rc=$?; echo "$rc" >"$RESHARDCTL_LOGS/rank-$r.exit"; exit "$rc"')
    q = shlex.quote
    return f"bash -c {q(redirect)} rank {q(python)} " + " ".join(q(a) for a in args)


def build_request(site, topology, run_dir: str, *, mode: str | None = None, label: str = "refit",
                  python: str, rank_args: list[str] | None = None, what: str | None = None,
                  timeout_s: float | None = None, retries: int = 0) -> SlurmRequest:
    """The request for one refit session of ``topology``'s two sides on ``site``. ``run_dir`` must be an
    absolute path every node sees; ``python`` is the ranks' interpreter when the profile names none;
    ``rank_args``: what each task runs after it (default: the refit worker on ``run_dir/session.pkl``).
    ``timeout_s`` (default: the profile's ``refit.timeout_s``) and ``retries``: the run's, for
    ``srun --wait`` (``runtime/bounds.py``: the refit worker waits for its peers' reports, so a task
    still running ``srun_wait_s`` after the first one ended is hung); other programs (``rank_args``),
    which do not wait for each other, get ``timeout_s`` + 60 s."""
    mode = mode or site.slurm.mode
    if mode not in MODES:
        raise InputError(f"--slurm-mode {mode!r}: expected one of {', '.join(MODES)}")
    if not PurePosixPath(run_dir).is_absolute():
        raise InputError(f"run directory {run_dir!r} must be an absolute path (every node must find it)")
    _run_dir_value(run_dir)
    g = topology.gpus_per_node
    parts = site.slurm.partitions
    train = _component("train", topology.train_world, g, parts.get("train"))
    infer = _component("infer", topology.infer_world, g, parts.get("infer"))
    out_dir = str(PurePosixPath(run_dir) / "slurm")
    name = f"reshardctl-{label}"
    if mode == "hetjob":
        sbatch = {"train": _sbatch_lines(train, site, name, f"{out_dir}/job-%j.out"),
                  "infer": _sbatch_lines(infer, site, "", None, job=False)}
    else:
        sbatch = {"train": _sbatch_lines(train, site, name + "-train", f"{out_dir}/train-%j.out"),
                  "infer": _sbatch_lines(infer, site, name + "-infer", f"{out_dir}/infer-%j.out")}
    py = site.slurm.python or python
    timeout = site.refit.timeout_s if timeout_s is None else timeout_s
    wait_s = srun_wait_s(timeout, retries) if rank_args is None else int(math.ceil(timeout)) + 60
    req = SlurmRequest(
        mode=mode, run_dir=run_dir, label=label, components=(train, infer), sbatch=sbatch,
        prologue=_prologue(site, run_dir, mode), srun_flags=_srun_flags(site, wait_s, run_dir),
        ranks_cmd=ranks_command(py, rank_args or worker_args(str(PurePosixPath(run_dir) / SESSION_FILE))),
        step_flags=_step_flags(site, mode),
        rendezvous=_rendezvous(site), rendezvous_timeout_s=int(math.ceil(site.refit.rendezvous_timeout_s)),
        peer_wait_s=site.slurm.peer_wait_s,
        train_world=topology.train_world, infer_world=topology.infer_world, what=what or f"refit {label}",
    )
    return req
