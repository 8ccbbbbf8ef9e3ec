"""Checks of the local ModelSpec builders (tests/helpers/parallel_models.py) the layout tests use: parameter and
tensor counts of the real architectures."""

from __future__ import annotations

from helpers.parallel_models import deepseek_v3, llama_8b, llama_70b, qwen3_30b, qwen3_235b


# ---------------------------------------------------------------------------- checks of the helper
def test_llama_counts():
    m = llama_70b()
    assert m.num_params == 70_553_706_496 and len(m.tensors) == 723
    assert llama_8b().num_bytes == 16_060_522_496


def test_qwen3_235b_counts():
    m = qwen3_235b()
    assert m.num_params == 235_093_634_560 and len(m.tensors) == 36_945
    assert qwen3_30b().num_params == 30_532_122_624


def test_deepseek_counts():
    main = deepseek_v3(mtp=0)
    assert sum(t.numel for t in main.tensors if t.kind != "scale_inv") == 671_026_419_200
    full = deepseek_v3()
    assert full.num_params == 684_531_386_000 and len(full.tensors) == 91_991
