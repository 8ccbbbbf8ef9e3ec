"""NeMo RL's own collective refit, term by term (plan/engine_cost.py, docs/cost-model.md "The framework's own
refit"): every term is present with its source, each grows with what it counts (tensors, buffers, mapping
entries, parameters, collectives), the pipeline's algebra (overlapped between the slowest phase and the serial
sum), and ``plan --json`` shows it."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.parallel_models import tiny_deepseek, tiny_qwen3_moe
from reshardctl.cli import main
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.parallel_spec import parse_parallel as P
from reshardctl.layout.vllm import VllmLayout
from reshardctl.models.architectures import EXPERT_KINDS
from reshardctl.plan.cost import Links
from reshardctl.plan.engine_cost import CONSUMER, ENGINE_TERMS, PRODUCER, SOURCES, framework_refit
from reshardctl.topology import Topology

GPU = Links(nvlink=380e9, nic=47e9, node_nic=376e9, nvlink_latency=2e-6, nic_latency=5e-6, launch=2e-6,
            copy=1000e9, checksum=500e9, msg_concurrency=8, nics_per_node=8, loader_call=20e-6,
            mapping_entry=40e-9, named_param=0.5e-6)
MB = 1 << 20


def run(model, train: str, infer: str, links=GPU, buffer=4 * MB, buffers=2, gpus=4):
    tr, inf = MegatronLayout(model, P(train + ",vocab_divisor=128")), VllmLayout(model, P(infer))
    topo = Topology(tr.world_size, inf.world_size, gpus, 1)
    return framework_refit(model, tr, inf, topo, links, buffer_bytes=buffer, buffers=buffers)


def test_every_term_with_its_source_and_the_breakdown_sums_to_the_prediction():
    r = run(tiny_deepseek(layers=4, fp8=False), "tp=2,pp=2,ep=2", "tp=2,dp=2")
    assert r["path"] == "nemo_rl_collective" and set(r["breakdown_s"]) == set(ENGINE_TERMS) == set(r["work_s"])
    assert set(SOURCES) == set(ENGINE_TERMS) and all(":" in SOURCES[t] for t in ENGINE_TERMS if t != "param_copy")
    assert all(v >= 0 for v in r["breakdown_s"].values())
    assert math.isclose(sum(r["breakdown_s"].values()), r["predicted_s"], rel_tol=1e-12)
    for t in ENGINE_TERMS:  # a term on the critical path never exceeds its work
        assert r["breakdown_s"][t] <= r["work_s"][t] * (1 + 1e-12), t
    # with pp, tp and ep on the trainer, every export term is paid
    assert all(r["work_s"][t] > 0 for t in ("export_pp_broadcast", "export_tp_gather", "export_ep_gather"))


def test_export_terms_need_their_parallelism():
    m = tiny_deepseek(layers=4, fp8=False)
    flat = run(m, "tp=1", "tp=2")["work_s"]
    assert flat["export_pp_broadcast"] == flat["export_tp_gather"] == flat["export_ep_gather"] == 0
    assert run(m, "pp=2", "tp=2")["work_s"]["export_pp_broadcast"] > 0
    assert run(m, "tp=2", "tp=2")["work_s"]["export_tp_gather"] > 0
    assert run(m, "ep=2", "tp=2")["work_s"]["export_ep_gather"] > 0


def test_per_tensor_terms_are_counts_times_the_calibrated_figures():
    """loader_calls = held tensors x loader_call; name_mapping = entries scanned x mapping_entry; load_setup
    = buffers x (2 walks x parameters x named_param + 3 x experts x mapping_entry), deepseek_v2.py's load_weights."""
    m = tiny_deepseek(layers=4, fp8=False)
    r = run(m, "tp=2", "tp=2", buffer=2 * MB)
    c, w = r["counts"], r["work_s"]
    assert math.isclose(w["loader_calls"], c["held_tensors"] * GPU.loader_call)
    assert math.isclose(w["name_mapping"], c["mapping_entries_scanned"] * GPU.mapping_entry)
    setup = 2 * c["params_on_rank"] * GPU.named_param + c["expert_mapping_entries"] * GPU.mapping_entry
    assert math.isclose(w["load_setup"], r["buckets"] * setup)
    assert c["expert_mapping_entries"] == 3 * m.dims.num_experts
    assert c["held_tensors"] == len(m.tensors)  # tp=2 without EP: every tensor has a part on rank 0
    # the scan: 6 stacked entries per tensor, then up to the expert's (w1, w2, w3) entry in expert order
    want = 6 * len(m.tensors) + sum(3 * t.expert + {"expert_gate": 1, "expert_down": 2, "expert_up": 3}[t.kind]
                                    for t in m.tensors if t.kind in EXPERT_KINDS)
    assert c["mapping_entries_scanned"] == want


def test_experts_other_ranks_hold_scan_the_whole_mapping():
    """vLLM with EP: rank 0 holds 1/ep of the experts; for the rest deepseek_v2.py's loop finds no local slot
    and scans all 3 x (E + R) entries."""
    m = tiny_deepseek(layers=4, fp8=False)
    no_ep, ep = run(m, "tp=2", "tp=2")["counts"], run(m, "tp=2", "tp=2,ep=2")["counts"]
    assert ep["held_tensors"] < no_ep["held_tensors"]
    assert ep["mapping_entries_scanned"] > no_ep["mapping_entries_scanned"]
    red = run(m, "tp=2", "tp=2,ep=2,redundant=2")["counts"]
    assert red["expert_mapping_entries"] == 3 * (m.dims.num_experts + 2)


def test_qwen3_moe_indexes_its_expert_mapping():
    """routed_experts.py:1004-1025 (AutoWeightsLoader models): no linear scan per expert tensor, one mapping
    built per MoE layer a buffer touches."""
    m = tiny_qwen3_moe()
    c = run(m, "tp=2", "tp=2")["counts"]
    assert c["mapping_entries_scanned"] == 5 * len(m.tensors)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(scale=st.floats(1.5, 20), term=st.sampled_from(["loader_call", "mapping_entry", "named_param"]))
def test_host_terms_scale_with_their_figure(scale, term):
    m = tiny_deepseek(layers=2, fp8=False)
    base = run(m, "tp=2", "tp=2")["work_s"]
    more = run(m, "tp=2", "tp=2", links=replace(GPU, **{term: getattr(GPU, term) * scale}))["work_s"]
    hit = {"loader_call": ("loader_calls",), "mapping_entry": ("name_mapping", "load_setup"),
           "named_param": ("load_setup",)}[term]
    for t in hit:
        assert more[t] > base[t]
    for t in set(ENGINE_TERMS) - set(hit):
        assert more[t] == base[t]


def test_more_tensors_and_smaller_buffers_cost_more():
    small, big = tiny_deepseek(layers=2, fp8=False), tiny_deepseek(layers=6, fp8=False)
    a, b = run(small, "tp=2,pp=2", "tp=2")["work_s"], run(big, "tp=2,pp=2", "tp=2")["work_s"]
    for t in ("export_pp_broadcast", "export_tp_gather", "name_mapping", "loader_calls", "pack", "broadcast"):
        assert b[t] > a[t], t
    coarse, fine = run(big, "tp=2", "tp=2", buffer=16 * MB), run(big, "tp=2", "tp=2", buffer=MB)
    assert fine["buckets"] > coarse["buckets"]
    assert fine["work_s"]["load_setup"] > coarse["work_s"]["load_setup"]
    assert fine["work_s"]["broadcast"] > coarse["work_s"]["broadcast"]  # a ring start-up per buffer


@settings(max_examples=30, deadline=None, derandomize=True)
@given(buffer_kib=st.integers(64, 1 << 15), train=st.sampled_from(["tp=2", "tp=2,pp=2", "ep=2", "tp=2,ep=2"]),
       infer=st.sampled_from(["tp=2", "tp=2,dp=2", "tp=4", "tp=2,ep=2"]), nvlink=st.floats(1e9, 1e12))
def test_overlap_lies_between_the_slowest_phase_and_the_serial_sum(buffer_kib, train, infer, nvlink):
    """Two buffers (packed_tensor.py): each buffer costs its slowest phase, so the refit is at least the total of
    any one phase and at most every phase one after the other (one buffer, NeMo RL before PR 1379)."""
    m = tiny_deepseek(layers=2, fp8=False)
    links = replace(GPU, nvlink=nvlink)
    two = run(m, train, infer, links, buffer=buffer_kib << 10)
    one = run(m, train, infer, links, buffer=buffer_kib << 10, buffers=1)
    w = two["work_s"]
    producer, consumer = sum(w[t] for t in PRODUCER), sum(w[t] for t in CONSUMER)
    slowest = max(producer, w["broadcast"], max(consumer, w["param_copy"]) if two["buckets"] == 1 else 0.0)
    assert two["predicted_s"] >= max(producer, w["broadcast"], slowest) * (1 - 1e-12)
    assert one["predicted_s"] >= two["predicted_s"] * (1 - 1e-12)
    assert one["predicted_s"] <= sum(w.values()) * (1 + 1e-12)
    assert math.isclose(one["predicted_s"], sum(one["breakdown_s"].values()), rel_tol=1e-12)


def test_other_styles_are_skipped_with_the_reason():
    from reshardctl.layout.build import build_layout

    m = tiny_qwen3_moe()
    tr, inf = build_layout(m, "train", "tp=2", "dtensor", None), VllmLayout(m, P("tp=2"))
    r = framework_refit(m, tr, inf, Topology(2, 2, 4, 1), GPU, buffer_bytes=MB)
    assert r == {"skipped": "modelled for a Megatron-Core trainer and a vLLM engine (NeMo RL's Megatron path)"}


def test_plan_json_shows_every_term(capsys):
    assert main(["plan", "--site", "local", "--model", "tiny-deepseek", "--train", "tp=2,pp=2", "--infer", "tp=2",
                 "--transport", "reshard", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["framework_refit"]
    assert set(out) == {"collective"}  # nccl_reshard needs the hybrid plan
    fr = out["collective"]
    assert set(fr["breakdown_s"]) == set(ENGINE_TERMS) == set(fr["work_s"]) == set(fr["sources"])
    assert fr["predicted_s"] > 0 and fr["counts"]["pp_broadcasts"] > 0 and fr["buckets"] >= 1
    assert fr["per_unit"]["mapping_entry_s"] > 0 and fr["per_unit"]["named_param_s"] > 0


def test_rank_0_exports_its_own_experts_and_gathers_the_rest():
    """Megatron-Bridge runs one conversion task per local parameter: trainer rank 0 PP-broadcasts the
    non-expert tensors and its EP rank's experts (1 / ep of them); one EP all-gather per local expert
    brings the other ep - 1 (param_mapping.py:727-806)."""
    m = tiny_deepseek(layers=4, fp8=False)
    experts = sum(t.kind in EXPERT_KINDS for t in m.tensors)
    for ep in (2, 4):
        c = run(m, f"pp=2,ep={ep}", "tp=2")["counts"]
        assert c["ep_gathers"] == experts // ep
        assert c["pp_broadcasts"] == len(m.tensors) - experts + experts // ep


def test_nccl_reshard_is_the_hybrid_plans_bulk_then_the_misc_path(capsys):
    """nccl-reshard-refit.md "Execution Flow": the bulk reshard first (the hybrid plan's rounds: wire, latency,
    pack), then the misc tensors through the collective path: only the tensors the plan broadcasts."""
    from reshardctl.api import plan_refit
    from reshardctl.plan.engine_cost import nccl_reshard_refit

    assert main(["plan", "--site", "local", "--model", "tiny-deepseek", "--train", "tp=2,pp=2", "--infer", "tp=2",
                 "--transport", "all", "--json"]) == 0
    fr = json.loads(capsys.readouterr().out)["framework_refit"]
    nr, col = fr["nccl_reshard"], fr["collective"]
    assert math.isclose(nr["predicted_s"], sum(nr["bulk_s"].values()) + nr["misc"]["predicted_s"], rel_tol=1e-12)
    assert set(nr["bulk_s"]) == {"wire", "latency", "pack"} and nr["bulk_s"]["wire"] > 0
    assert 0 < nr["misc_tensors"] < col["tensors"] and nr["misc"]["counts"]["held_tensors"] <= nr["misc_tensors"]
    assert nr["misc"]["work_s"]["loader_calls"] < col["work_s"]["loader_calls"]
    plan = plan_refit(model="tiny-deepseek", train="tp=2,pp=2", infer="tp=2", site="local", transport="reshard")
    assert nccl_reshard_refit(plan, GPU, buffer_bytes=MB) == {"skipped": "needs the hybrid plan (got reshard)"}
