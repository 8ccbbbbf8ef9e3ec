"""`reshardctl calibrate`'s figures table names every figure a calibration writes (a Slurm calibration of
slurm-local ended on a KeyError traceback at `landing_s_per_param` after writing its file)."""

from __future__ import annotations

import io

from rich.console import Console

from reshardctl.commands.calibrate import figure_text, figures_table
from reshardctl.site.measured import FIGURES, OPTIONAL_FIGURES


def test_every_figure_a_calibration_writes_has_a_row_with_its_unit():
    figs = {k: (2.5e9 if k.endswith("_bytes_per_s") else 1.5e-6) for k in FIGURES + OPTIONAL_FIGURES}
    buf = io.StringIO()
    Console(file=buf, width=120).print(figures_table(figs))
    text = buf.getvalue()
    assert "landing, per parameter segment" in text and "framework loader, per tensor" in text
    rows = [line for line in text.splitlines() if "GB/s" in line or " us" in line]
    assert len(rows) == len(figs), text
    assert figure_text("landing_s_per_param", 1.5e-6) == "1.5 us"
    assert figure_text("checksum_world_bytes_per_s", 1.94e9) == "1.94 GB/s"
