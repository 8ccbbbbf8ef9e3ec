"""The CLI loads numpy with one OpenBLAS thread (cli._import_numpy_with_one_blas_thread) and leaves the
environment as it found it, so the processes a command starts see the user's settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os
import reshardctl.cli
import numpy as np
print("OPENBLAS_NUM_THREADS" in os.environ)
a = np.ones((300, 300)); a @ a
print(len(os.listdir("/proc/self/task")))
"""


def _run(env: dict) -> list[str]:
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_one_blas_thread_and_environment_restored():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    assert _run(env) == ["False", "1"]


def test_a_users_thread_count_is_kept():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    env.pop("OMP_NUM_THREADS", None)
    assert _run(env)[0] == "True"
