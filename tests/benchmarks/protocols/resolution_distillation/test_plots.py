"""benchmarks/protocols/resolution_distillation/plots.py: the performance-vs-FLOPs figure (RAML Fig. 4 style)."""

import os
import tempfile

from benchmarks.protocols.resolution_distillation import variants as parts
from benchmarks.protocols.resolution_distillation.plots import plot_performance_vs_flops
from pml_extensions.runner.outputs.results import summarize

from .test_variants import hand_rows


def test_plot_is_a_png():
    rows = hand_rows()
    results = summarize(parts.per_seed_table(rows), [], extra={"rows": rows, "curve": []})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fig.png")
        plot_performance_vs_flops(results, path)
        with open(path, "rb") as f:
            assert f.read(4) == b"\x89PNG"
