"""The paper-layout tables of benchmarks/resolution_distillation.py (RAML Table 2 blocks, Tables 3-4, the curve, the
selection and the claims), rendered from the protocol's results on hand-made rows."""

import importlib.util
import os

import numpy as np
import pytest

from benchmarks.protocols.resolution_distillation import variants as parts
from benchmarks.protocols.resolution_distillation.evaluation import selection_lines
from pml_extensions.runner.outputs.results import summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench():
    """benchmarks/resolution_distillation.py as a module (the paper's Table 2 layout)."""
    spec = importlib.util.spec_from_file_location(
        "resolution_distillation_bench", os.path.join(ROOT, "benchmarks", "resolution_distillation.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return load_bench()


def _hand_rows():
    from tests.benchmarks.protocols.resolution_distillation.test_variants import hand_rows

    return hand_rows()


def test_table2_and_ablation_rows(bench):
    rows = _hand_rows()
    table = parts.per_seed_table(rows)
    comps = parts.default_comparisons(rows)
    results = summarize(table, comps, metrics=(parts.PRIMARY,), extra={"rows": rows, "curve": []})
    md = bench.markdown_tables(results)
    # block 1 at 24 px: 30, 30, 40 -> 33.33 ± 5.77 (sample std)
    assert "| 1 symmetric | low_resolution_teacher_symmetric | 33.33 ± 5.77 |" in md
    assert "| 3 distilled asymmetric | teacher_student_asymmetric | 40.00 ± 10.00 |" in md
    assert "| distilled asym. − naive asym. (teacher on small queries) | +20.00 [+20.00, +20.00] |" in md
    # abs-only − full: -0.05, -0.10, 0.00 -> mean -5.00, t(2) CI -5 ± 4.303 · 5/sqrt(3)
    half = 4.302652729911275 * 5 / np.sqrt(3)
    assert f"| loss_abs_only | 35.00 ± 13.23 | 35.00 ± 13.23 | -5.00 [{-5 - half:+.2f}, {-5 + half:+.2f}] |" in md

    # the claims in the runner's vocabulary, δ = 1 MAP@R point, Holm over four (t_{0.975, 2} = 4.3027, two-sided
    # p = 1 − t / √(t² + 2), the seed bootstrap's p at most 2 · (1/27 of 10000 + 1) / 10001 ≈ 0.075 below them):
    # naive 0.2, 0.2, 0.2 (bootstrap p 2 / 10001 = 0.0002, the t-test's ≈ 0); low-resolution teacher 0, 0.1, 0.1
    # (t 2.0, p 0.1835, interval [-0.077, +0.210]); student symmetric -0.02, 0, -0.01 (t -1.732, p 0.2254,
    # [-0.035, +0.015]); abs-only − full -0.05, -0.10, 0 (t -1.732, p 0.2254). Holm: 4 · 0.0002 = 0.0008,
    # 3 · 0.1835 = 0.5505, max(2 · 0.2254, 0.5505) = 0.5505 for both others.
    results["claims"] = bench.claim_comparisons(results)
    claims = results["claims"]["comparisons"]
    assert [(c["baseline"].split("/")[-1], c["claim"]) for c in claims] == [
        ("teacher_asymmetric", "greater"),
        ("low_resolution_teacher_symmetric", "greater"),
        ("student_symmetric", "on_par"),
        ("teacher_student_asymmetric", "less"),
    ]
    assert [c["p_holm"] for c in claims] == [pytest.approx(p, abs=1e-3) for p in (0.0008, 0.5505, 0.5505, 0.5505)]
    assert [c["verdict"] for c in claims] == [
        "shown",  # [0.2, 0.2], p̃ 0.0008, 20 points ≥ 1
        "inconclusive (3 seeds)",  # contains 0
        "inconclusive (3 seeds)",  # on par: [-3.5, +1.5] points reaches past ±1
        "inconclusive (3 seeds)",  # contains 0
    ]
    text = bench.claims(results)
    assert "vs naive asymmetric +20.00 MAP@R points (95 % CI [+20.00, +20.00], p (Holm) 0.0008): **shown**" in text
    assert f"loss_abs_only -5.00 MAP@R points (95 % CI [{-5 - half:+.2f}, {-5 + half:+.2f}], p (Holm) 0.55): " in text
    assert "vs the student's own symmetric -1.00 MAP@R points" in text and "Holm-adjusted over the 4 claims" in text


def test_curve_table(bench):
    curve = [
        {"dataset": "glyphs", "seed": s, "query_resolution": 24, "setup": setup, "iteration": it, parts.PRIMARY: v}
        for s in (0, 1)
        for it, (a, b) in {0: (0.1, 0.3), 10: (0.25, 0.3)}.items()
        for setup, v in (("teacher_student_asymmetric", a + 0.1 * s), ("student_symmetric", b + 0.1 * s))
    ]
    rows = _hand_rows()
    results = summarize(parts.per_seed_table(rows), [], extra={"rows": rows, "curve": curve})
    md = bench.markdown_tables(results)
    assert "| 0 | 15.00 ± 7.07 | 35.00 ± 7.07 | -20.00 ± 0.00 |" in md
    assert "| 10 | 30.00 ± 7.07 | 35.00 ± 7.07 | -5.00 ± 0.00 |" in md
    assert "one-cycle" not in md  # no config: the schedule is not named
    results["config"], results["selection"] = (
        {"student_iterations": 10},
        [
            {
                "dataset": "glyphs",
                "seed": 0,
                "query_resolution": 24,
                "student_variant": "full",
                "lr": 1e-4,
                "iteration": 10,
                "validation": 0.5,
            }
        ],
    )
    assert "One one-cycle schedule of 10 iterations" in bench.markdown_tables(results)


def test_grid_and_selected_iterations(bench):
    selection = [
        {
            "dataset": "glyphs",
            "seed": s,
            "query_resolution": 24,
            "student_variant": v,
            "lr": 3e-05,
            "iteration": it,
            "validation": val,
        }
        for s, v, it, val in ((0, "full", 150, 0.3617), (1, "full", 200, 0.25), (0, "loss_abs_only", 0, 0.1))
    ] + [
        {
            "dataset": "glyphs",
            "seed": 0,
            "query_resolution": 24,
            "student_variant": "lr_grid",
            "lr": 3e-05,
            "validation_by_lr": {"1e-05": 0.3158, "3e-05": 0.3617},
        }
    ]
    text = "\n".join(selection_lines(selection))
    assert "| glyphs | 0 | 31.58 | 36.17 | 3e-05 |" in text
    assert "| glyphs | 24 | full | 150, 200 | 36.17, 25.00 |" in text
    assert "| glyphs | 24 | loss_abs_only | 0 | 10.00 |" in text
    assert text.index("| full |") < text.index("| loss_abs_only |")
    assert selection_lines([]) == []
