"""Which GPU tests run on this machine (tests/conftest.py): a test marked ``gpu`` needs CUDA and one device;
``@pytest.mark.gpus(n)`` says it needs ``n`` (an NCCL world of n ranks: one device per rank) and marks it
``multi_gpu`` too, so ``make test-gpu-one`` (``-m "gpu and not multi_gpu"``) selects what one device can run.
With ``RESHARDCTL_TEST_GPU=1`` a test that needs more devices than this machine has is skipped, naming both."""

from __future__ import annotations


def needed_gpus(item) -> int:
    """The devices a ``gpu`` test needs: its ``gpus(n)`` mark (the closest one), else 1."""
    mark = item.get_closest_marker("gpus")
    if mark is None:
        return 1
    if len(mark.args) != 1 or not isinstance(mark.args[0], int) or mark.args[0] < 1:
        raise ValueError(f"{item.nodeid}: @pytest.mark.gpus takes one positive int, got {mark.args}")
    return mark.args[0]


def skip_reason(need: int, found: int, cuda: bool) -> str | None:
    """Why a test that needs ``need`` devices cannot run here (``found`` visible, ``cuda`` available), or None."""
    if not cuda:
        return f"needs {need} GPU{'s' if need > 1 else ''}, found none (torch.cuda.is_available() is False)"
    if found < need:
        return f"needs {need} GPUs, found {found}"
    return None


def visible_gpus() -> tuple[int, bool]:
    """(device count, CUDA available) of this process's torch."""
    import torch

    cuda = torch.cuda.is_available()
    return (torch.cuda.device_count() if cuda else 0), cuda
