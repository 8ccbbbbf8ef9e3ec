"""Dump megatron-core's own rank grids into ``rank_order.json`` beside this file: per configuration (sizes and
``initialize_model_parallel(order=...)``), every rank's coordinates in the dense and the expert grid, as
``parallel_state.initialize_model_parallel`` builds them from ``RankGenerator`` (megatron-core 0.16.1
``parallel_state.py:775-815``; 0.19.0 ``:859-907`` is the same with a size-1 ``gtp_remat`` axis), or the
message of the assertion that refuses the configuration.

Runs only with megatron-core installed (the separate venv of README.md here); no process group is needed:
``RankGenerator`` is pure arithmetic. tests/layout/test_megatron_rank_order.py reads the JSON only.

    /work/mcore-venv/bin/python rank_order.py
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

from megatron.core.parallel_state import RankGenerator

HERE = Path(__file__).resolve().parent
ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")  # megatron-core's default; Megatron-Bridge use_tp_pp_dp_mapping=True

# (tp, cp, dp, pp, ep, etp)
SIZES = [
    (2, 1, 2, 2, 1, None),
    (2, 2, 2, 2, 1, None),
    (1, 1, 2, 4, 1, None),
    (2, 1, 2, 3, 2, 1),
    (2, 1, 2, 2, 2, 1),
    (4, 1, 1, 2, 2, 2),
    (2, 2, 2, 2, 4, 1),
    (2, 1, 2, 2, 4, 1),  # etp*ep = 4 != tp*cp = 2: pp-dp order refused with pp > 1
    (4, 1, 2, 2, 8, 1),  # the same, larger
    (2, 1, 4, 1, 4, 1),  # pp = 1: both orders allowed (and equal)
    (2, 2, 1, 2, 2, 2),  # ep and cp: etp*ep = 4 = tp*cp
]


def coords(gen: RankGenerator, tokens: tuple[str, ...], world: int) -> list[dict[str, int]]:
    """Each rank's index in its group of every token (what parallel_state's get_*_rank returns)."""
    out: list[dict[str, int]] = [{} for _ in range(world)]
    for tok in tokens:
        for group in gen.get_ranks(tok):
            for i, r in enumerate(group):
                out[r][tok] = i
    return out


def grids(tp: int, cp: int, dp: int, pp: int, ep: int, etp, order: str) -> dict:
    """initialize_model_parallel's two generators and its two assertions on them."""
    world = tp * cp * dp * pp
    etp = etp or tp
    edp = world // (etp * ep * pp)
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order, rank_offset=0)
    expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order, rank_offset=0)
    if not (order.endswith("pp") or pp == 1 or edp == dp):
        return {"refused": "When not using pp-last rank ordering, the data parallel size of the attention and moe "
                           "layers must be the same"}
    if dense.get_ranks("pp") != expert.get_ranks("pp"):
        return {"refused": "Pipeline parallel groups are expected to be the same for Non-Expert and Expert part"}
    d = coords(dense, ("tp", "cp", "dp", "pp"), world)
    e = coords(expert, ("tp", "ep", "dp", "pp"), world)
    ranks = [{**d[r], "etp": e[r]["tp"], "ep": e[r]["ep"], "edp": e[r]["dp"], "epp": e[r]["pp"]} for r in range(world)]
    return {"ranks": ranks}


def main() -> None:
    configs = []
    for tp, cp, dp, pp, ep, etp in SIZES:
        for order in ORDERS:
            configs.append({"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp, "order": order,
                            **grids(tp, cp, dp, pp, ep, etp, order)})
    doc = {"megatron_core": version("megatron-core"), "source": "megatron/core/parallel_state.py RankGenerator, "
           "initialize_model_parallel", "configs": configs}
    (HERE / "rank_order.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(configs)} configurations to {HERE / 'rank_order.json'}")


if __name__ == "__main__":
    main()
