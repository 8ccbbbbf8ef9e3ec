"""Fewer cyclic collections while a pass builds many small objects that stay alive.

Planning (`reshardctl plan`: tensor specs, placements, bucket regions) and a rank's program (its regions,
links and messages: some 50k regions for DeepSeek-V3 at 256 + 256) allocate 10^5 small objects that
live on; at the default gen-0 threshold (700) the cyclic collector walks them, and everything already
alive (a loaded plan's model and layouts), again and again: a rank's program took 0.2 s of collection
for 0.03 s of building its steps. The threshold is raised for the pass and restored after.

At the end of a process the same objects cost the collector's passes over them during interpreter
shutdown (0.1 s after `plan` of DeepSeek-V3 at 256 + 256): ``frozen_for_exit`` moves them out of its sight
first (the objects are still released by their reference counts, and exit handlers still run).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def few_collections(threshold: int = 100_000) -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(max(threshold, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def frozen_for_exit() -> None:
    """The process exits next: every object alive now is left out of the shutdown's collections."""
    gc.freeze()
