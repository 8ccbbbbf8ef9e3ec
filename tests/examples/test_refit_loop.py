"""examples/refit_loop.py as a user runs it: four real gloo processes in two worlds, the site's ledger in
charge. A ``reshardctl rollback`` from the CLI while the loop runs switches the next refit to
gather-and-broadcast, ``reshardctl promote`` switches it back, and a ledger that becomes unreadable
mid-loop keeps the last good decision (said once) without stopping the job."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers.runbook_helpers import ledger_lines, site_profile
from helpers.small_llama import SMALL_LLAMA
from reshardctl.runs.records import read_events

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "refit_loop.py"
sys.path.insert(0, str(EXAMPLE.parent))
from stand_in_models import MegatronGPT, VllmLlama, reference_weights  # noqa: E402

CLI = [sys.executable, "-m", "reshardctl"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


# enough refits that a loaded machine (the CLI commands between them take seconds each) still has steps left
# after the ledger is corrupted; the loop's steps are 1.5 s apart
STEPS = 14


class _Loop:
    """The example running in the background; each JSON line kept with the time it arrived."""

    def __init__(self, site: str, model: str, steps: int, sleep_s: float, events_dir: Path):
        self.proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--site", site, "--model", model, "--steps",
                                      str(steps), "--sleep-s", str(sleep_s), "--events-dir", str(events_dir)],
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, dict]] = []
        self.stderr = ""
        self._out = threading.Thread(target=self._read, daemon=True)
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._out.start()
        self._err.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.append((time.monotonic(), json.loads(raw)))

    def _read_err(self) -> None:
        self.stderr = self.proc.stderr.read()

    def wait_for(self, pred, what: str, limit_s: float = 300) -> dict:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            for _, line in self.lines:
                if pred(line):
                    return line
            if self.proc.poll() is not None and not self._out.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"the loop never printed {what}; lines: {[ln for _, ln in self.lines]}; "
                             f"stderr: {self.stderr[-2000:]}")

    def finish(self) -> int:
        rc = self.proc.wait(timeout=600)
        self._out.join()
        self._err.join()
        return rc

    def after(self, t: float) -> list[dict]:
        """Lines of the refits that certainly decided after ``t``: the previous refit's line arrived
        after ``t`` (rank 0 decides at the start of its next refit, a sleep later)."""
        steps = {ln["step"]: at for at, ln in self.lines}
        return [ln for _, ln in self.lines if steps.get(ln["step"] - 1, -1.0) > t]

    def before(self, t: float) -> list[dict]:
        """Lines of the refits that certainly decided before ``t``: their own line arrived before it."""
        return [ln for at, ln in self.lines if at < t]


@pytest.fixture(scope="module")
def promoted_site(tmp_path_factory):
    """A site whose profile says gather_broadcast, promoted to reshard from a real bench run; a small
    Llama config (the catalog's tiny-llama is the example's default: its weights cost seconds per step
    to generate in each of the four processes)."""
    tmp = tmp_path_factory.mktemp("loop-site")
    state = tmp / "state"
    site = site_profile(tmp, "loop", budget_s=60, state_dir=state)
    (tmp / "small").mkdir()
    (tmp / "small" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    model = str(tmp / "small")
    layout = ["--model", model, "--train", "tp=2", "--infer", "tp=2"]
    bench = _cli("bench", "--site", site, *layout, "--iters", "1", "--warmup", "0", "--transport", "reshard",
                 "--transport", "gather_broadcast", "--out", str(tmp / "bench"))
    assert bench.returncode == 0, bench.stderr
    promote = _cli("promote", "--site", site, "--run", str(tmp / "bench"), "--force", "--reason", "loop test")
    assert promote.returncode == 0, promote.stderr
    return site, state, tmp / "bench", model


def test_rollback_and_promote_from_the_cli_switch_the_next_refit_of_a_running_loop(promoted_site):
    site, state, bench, model = promoted_site
    loop = _Loop(site, model, steps=STEPS, sleep_s=1.5, events_dir=state.parent / "loop-events")
    first = loop.wait_for(lambda ln: ln["step"] == 1, "step 1")
    promoted = ledger_lines(state)[-1]
    assert promoted["action"] == "promote" and promoted["transport"] == "reshard"
    assert first["transport"] == "reshard" and first["verified"] is True
    assert first["ledger_entry"]["action"] == "promote" and first["ledger_entry"]["line"] == len(ledger_lines(state))

    rb = _cli("rollback", "--site", site, "--reason", "loop test: back to gather_broadcast")
    assert rb.returncode == 0, rb.stderr
    t_rollback = time.monotonic()
    rollback_line = len(ledger_lines(state))
    loop.wait_for(lambda ln: ln in loop.after(t_rollback), "a refit decided after the rollback")

    t_promote = time.monotonic()
    pr = _cli("promote", "--site", site, "--run", str(bench), "--force", "--reason", "loop test: reshard again")
    assert pr.returncode == 0, pr.stderr
    t_promoted = time.monotonic()
    promote_line = len(ledger_lines(state))
    loop.wait_for(lambda ln: ln["transport"] == "reshard" and (ln["ledger_entry"] or {}).get("line") == promote_line,
                  "a reshard refit after the second promote")

    # the ledger becomes unreadable mid-loop (a line that is not JSON): the job keeps the last good decision
    ledger = state / "local.ledger.jsonl"
    with open(ledger, "a") as f:
        f.write("{not json\n")
    t_corrupt = time.monotonic()
    rc = loop.finish()
    assert rc == 0, loop.stderr[-3000:]

    lines = [ln for _, ln in loop.lines]
    assert [ln["step"] for ln in lines] == list(range(1, STEPS + 1))
    assert all(ln["verified"] for ln in lines)
    after_rb = [ln for ln in loop.after(t_rollback) if ln in loop.before(t_promote)]
    assert after_rb, "no refit decided between the rollback and the second promote"
    for ln in after_rb:
        assert ln["transport"] == "gather_broadcast", ln
        assert ln["ledger_entry"]["action"] == "rollback" and ln["ledger_entry"]["line"] == rollback_line
    assert loop.after(t_promoted)
    for ln in loop.after(t_promoted):
        assert ln["transport"] == "reshard" and ln["ledger_entry"]["line"] == promote_line, ln
    assert loop.after(t_corrupt), "no refit decided after the ledger went bad"
    # said once (by update rank 0, the only rank that reads the ledger), never fatal
    assert loop.stderr.count("keeping the last good decision: reshard") == 1, loop.stderr
    assert f"ledger {ledger}, line {promote_line + 1}: not valid JSON" in loop.stderr
    # --events-dir: every rank's events, and each step's decision there is the transport the loop printed
    decided = {}
    for rank in range(4):
        for ev in read_events(state.parent / "loop-events" / "events" / f"rank-{rank}.jsonl"):
            if ev["phase"] == "decide":
                decided.setdefault(ev["step"], set()).add((rank, ev["transport"]))
    assert {step: {t for _, t in got} for step, got in decided.items()} == {ln["step"]: {ln["transport"]} for ln in lines}
    assert all(len(got) == 4 for got in decided.values())


def test_the_examples_reference_check_fails_on_a_single_wrong_element():
    """The loop's verification is independent of reshardctl and can fail: an inference rank whose
    parameters hold the reference except one element is reported, parameter by parameter."""
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 96,
              "vocab_size": 250, "num_hidden_layers": 1}
    full = reference_weights(config, step=3)
    for rank in range(2):
        engine = VllmLlama(config, tp=2, rank=rank)
        with torch.no_grad():
            for name, p in engine.module.named_parameters():
                p.copy_(engine.expected(full)[name])
        assert engine.matches(full) == []
        qkv = dict(engine.module.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"]
        with torch.no_grad():
            qkv[-1, -1] += 1  # the last v row: kv head 0 replicated on both ranks (tp 2 > 1 kv head)
        assert engine.matches(full) == ["model.layers.0.self_attn.qkv_proj.weight"]
    trainer = MegatronGPT(config, tp=2, rank=1)
    trainer.train_step(full)
    fc1 = dict(trainer.module.named_parameters())["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:48], full["model.layers.0.mlp.gate_proj.weight"][48:])
    assert torch.equal(fc1[48:], full["model.layers.0.mlp.up_proj.weight"][48:])
