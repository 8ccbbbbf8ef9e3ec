"""The GPU tests' marks (tests/helpers/gpu_marks.py, tests/conftest.py): with RESHARDCTL_TEST_GPU=1 a test
marked gpus(n) on a machine with fewer devices is skipped naming both counts, and ``-m "gpu and not
multi_gpu"`` (make test-gpu-one) selects exactly the tests one device can run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.gpu_marks import skip_reason

ROOT = Path(__file__).resolve().parent.parent


def test_skip_reasons_name_what_is_needed_and_what_is_there():
    assert skip_reason(2, 1, True) == "needs 2 GPUs, found 1"
    assert skip_reason(4, 1, True) == "needs 4 GPUs, found 1"
    assert skip_reason(1, 0, False).startswith("needs 1 GPU, found none")
    assert skip_reason(1, 1, True) is None and skip_reason(4, 8, True) is None


def test_one_device_selection_runs_the_single_gpu_tests_and_deselects_the_multi_gpu_ones():
    env = {**os.environ, "RESHARDCTL_TEST_GPU": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m",
                           "gpu and not multi_gpu", "tests/runtime/test_gpu.py", "tests/runtime/test_gpu_single.py"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    text = proc.stdout + proc.stderr
    skipped = {f: (int(n), why) for n, f, why in re.findall(r"^SKIPPED \[(\d+)\] (\S+?)(?::\d+)?: (.*)$", text, re.M)}
    why = "needs 1 GPU, found none (torch.cuda.is_available() is False)"
    assert skipped == {"tests/runtime/test_gpu.py": (2, why), "tests/runtime/test_gpu_single.py": (4, why)}, text
    assert re.search(r"\b6 skipped, 9 deselected\b", text), text  # test_gpu.py's nine gpus(4) tests
