"""DTensor parameters (FSDP2, a DTensor TP plan: Hugging Face names) are bound by their local shards:
two real gloo ranks build torch DTensors of every HF tensor (column-parallel Shard(0), row-parallel
Shard(1), the rest replicated, an uneven vocabulary split by torch's own chunking), and each view bind
returns holds exactly the global box the plan says the rank holds, in the DTensor's own storage."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from reshardctl.bind.binding import bind
from reshardctl.layout.placement import full_box
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.bound_modules import module_of, small_plan
from helpers.parallel_models import build_model
from helpers.spawned_ranks import run_ranks

COLUMN = {"q", "k", "v", "mlp_gate", "mlp_up", "embed", "lm_head"}
ROW = {"o", "mlp_down"}


def _model():  # vocabulary 1001: torch's chunking gives rank 0 501 rows, rank 1 500
    return build_model("tiny-llama-odd", arch="llama", H=64, L=1, nh=8, nkv=4, hd=8, V=1001, I=128)


def _rank(rank: int, port: int, q) -> None:
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
        plan = small_plan(_model(), "tp=2", "tp=1", "dtensor", "dtensor")
        full, params = {}, {}
        for t in plan.model.tensors:
            full[t.name] = synthetic_region(t, full_box(t.shape), 1)
            tp = Shard(0) if t.kind in COLUMN else Shard(1) if t.kind in ROW else Replicate()
            params[t.name] = distribute_tensor(full[t.name].clone(), mesh, [Replicate(), tp])
        module = module_of(params)
        binding = bind(plan, "train", rank, module)
        wrong = []
        for i, boxes in plan.src_holdings(rank).items():
            name = plan.model.tensors[i].name
            for box, v in zip(boxes, binding.tensors()[name]):
                want = full[name][tuple(slice(a, b) for a, b in box)]
                if not torch.equal(v.view(torch.uint8), want.view(torch.uint8)):
                    wrong.append((name, box))
        embed = binding.tensors()["model.embed_tokens.weight"][0]
        embed.zero_()  # written through the view: the DTensor's own local shard changes
        local = dict(module.named_parameters())["model.embed_tokens.weight"].to_local()
        dist.destroy_process_group()
        q.put((rank, (wrong, tuple(local.shape), bool((local == 0).all())), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


@pytest.fixture(scope="module")
def bound():
    return run_ranks(_rank, 2, lambda r, port, q: (r, port, q), timeout_s=300)


def test_dtensor_parameters_are_bound_by_their_local_shards(bound):
    for r, (wrong, embed_shape, zeroed) in bound.items():
        assert wrong == [], (r, wrong)
        assert embed_shape == ((501, 64) if r == 0 else (500, 64))
        assert zeroed
