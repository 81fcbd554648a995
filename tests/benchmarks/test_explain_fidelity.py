"""benchmarks/explain_fidelity.py: the paired difference against the random map (the runner's t interval) and the
ranking lines, on hand-made areas."""

import importlib.util
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    spec = importlib.util.spec_from_file_location("ef", os.path.join(ROOT, "benchmarks", "explain_fidelity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_difference_to_the_random_map_and_the_ranking_lines():
    """Deletion areas: every method 1, 2, 6 on seeds 0-2 (one pair each), the random map 0: differences 1, 2, 6, mean
    3, sd √7, t interval 3 ± 4.302653 · √7 / √3 = 3 ± 6.5724 (contains 0); insertion areas: every method 3, 3.5, 4,
    the random map 1: differences 2, 2.5, 3, interval 2.5 ± 4.302653 · 0.5 / √3 = [1.258, 3.742] (above 0)."""
    ef = _module()
    per_seed = {
        s: {
            m: {"deletion_area": [0.0 if m == "random map" else [1.0, 2.0, 6.0][s]],
                "insertion_area": [1.0 if m == "random map" else [3.0, 3.5, 4.0][s]]}
            for m in ef.METHODS
        }
        for s in range(3)
    }  # fmt: skip
    summary = ef.summarise(per_seed)
    half = 4.302652729911275 * math.sqrt(7.0) / math.sqrt(3.0)
    d = summary["Decomposition"]["deletion_area"]["diff_vs_random"]
    assert d["mean"] == pytest.approx(3.0) and d["ci95"] == pytest.approx([3.0 - half, 3.0 + half], abs=1e-9)
    i = summary["Grad-CAM"]["insertion_area"]["diff_vs_random"]
    assert i["ci95"] == pytest.approx([1.258, 3.742], abs=1e-3)
    lines = ef._table(summary)
    assert "| Decomposition | 3.0000 ± 2.6458 | +3.0000 [-3.5724, +9.5724] |" in lines[2]
    assert lines[-2].endswith("above its insertion area): none.")  # deletion: no method below the random map
    assert lines[-1] == "Not on both: Decomposition, Decomposition+Bias, Grad-CAM, Grad-CAM (no norm), RGrad-CAM."
