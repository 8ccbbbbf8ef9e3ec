"""A process target for the start-method tests: says what it inherited (environment, standard output)."""

from __future__ import annotations

import os
import sys


def report(inherited) -> None:
    if inherited is not None:
        inherited.apply()
    print("probe=" + os.environ.get("RESHARDCTL_PROBE", "unset"), flush=True)
    print("probe-err", file=sys.stderr, flush=True)
