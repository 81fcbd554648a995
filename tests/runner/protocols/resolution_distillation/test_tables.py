"""Data helpers and paper-layout tables of the resolution-distillation protocol, on hand-made rows."""

import os
import tempfile
import unittest

import numpy as np

from pml_extensions.runner.outputs.results import summarize
from pml_extensions.runner.protocols.resolution_distillation import recipe
from pml_extensions.runner.protocols.resolution_distillation import tables as parts

KEYS = list(parts.METRICS)


def row(setup, q, seed, value, variant=None, db=64):
    return {
        "dataset": "glyphs",
        "setup": setup,
        "query_resolution": q,
        "database_resolution": db,
        "reference_resolution": db,
        "seed": seed,
        "student_variant": variant,
        "query_flops": 2e6 if q < db else 8e6,
        **{k: value for k in KEYS},
    }


def hand_rows():
    rows = []
    # seed: (teacher sym, teacher asym, low-res sym, distilled asym, student sym, abs-only asym)
    for seed, (ts, ta, lr, da, ss, ab) in {
        0: (0.5, 0.1, 0.3, 0.30, 0.32, 0.25),
        1: (0.6, 0.2, 0.3, 0.40, 0.40, 0.30),
        2: (0.7, 0.3, 0.4, 0.50, 0.51, 0.50),
    }.items():
        rows += [
            row("teacher_symmetric", 64, seed, ts),
            row("teacher_asymmetric", 24, seed, ta),
            row("low_resolution_teacher_symmetric", 24, seed, lr),
            row("teacher_student_asymmetric", 24, seed, da, "full"),
            row("student_symmetric", 24, seed, ss, "full"),
            row("teacher_student_asymmetric", 24, seed, ab, "loss_abs_only"),
            row("student_symmetric", 24, seed, ab, "loss_abs_only"),
        ]
    return rows


class TestParts(unittest.TestCase):
    def test_eval_transform_size(self):
        from PIL import Image

        self.assertEqual(tuple(recipe.eval_transform(24)(Image.new("RGB", (50, 30))).shape), (3, 24, 24))

    def test_unknown_dataset(self):
        with self.assertRaisesRegex(ValueError, "unknown dataset 'mnist'"):
            recipe.load_dataset("mnist", {})

    def test_per_seed_and_comparisons(self):
        rows = hand_rows()
        table = parts.per_seed_table(rows)
        self.assertEqual(table["glyphs/24px/teacher_student_asymmetric"][1]["mean_average_precision_at_r"], 0.40)
        self.assertEqual(table["glyphs/24px/teacher_student_asymmetric/loss_abs_only"][2]["recall_at_1"], 0.50)
        comps = parts.default_comparisons(rows)
        asym = "glyphs/24px/teacher_student_asymmetric"
        self.assertEqual(
            comps,
            [
                (asym, "glyphs/24px/teacher_asymmetric"),
                (asym, "glyphs/24px/low_resolution_teacher_symmetric"),
                (asym, "glyphs/24px/student_symmetric"),
                (asym, "glyphs/64px/teacher_symmetric"),
                (asym + "/loss_abs_only", asym),
            ],
        )
        results = summarize(table, comps, metrics=(parts.PRIMARY,), extra={"rows": rows, "curve": []})
        c = results["comparisons"][0]  # distilled − naive: differences 0.2, 0.2, 0.2
        self.assertAlmostEqual(c["mean_difference"], 0.2)
        self.assertAlmostEqual(c["ci95"][0], 0.2)
        self.assertAlmostEqual(c["ci95"][1], 0.2)
        md = parts.markdown_tables(results)
        # block 1 at 24 px: 30, 30, 40 -> 33.33 ± 5.77 (sample std)
        self.assertIn("| 1 symmetric | low_resolution_teacher_symmetric | 33.33 ± 5.77 |", md)
        self.assertIn("| 3 distilled asymmetric | teacher_student_asymmetric | 40.00 ± 10.00 |", md)
        self.assertIn("| distilled asym. − naive asym. (teacher on small queries) | +20.00 [+20.00, +20.00] |", md)
        # abs-only − full: -0.05, -0.10, 0.00 -> mean -5.00, t(2) CI -5 ± 4.303 · 5/sqrt(3)
        half = 4.302652729911275 * 5 / np.sqrt(3)
        self.assertIn(
            f"| loss_abs_only | 35.00 ± 13.23 | 35.00 ± 13.23 | -5.00 [{-5 - half:+.2f}, {-5 + half:+.2f}] |", md
        )

    def test_curve_table_and_plot(self):
        curve = [
            {"dataset": "glyphs", "seed": s, "query_resolution": 24, "setup": setup, "iteration": it, parts.PRIMARY: v}
            for s in (0, 1)
            for it, (a, b) in {0: (0.1, 0.3), 10: (0.25, 0.3)}.items()
            for setup, v in (("teacher_student_asymmetric", a + 0.1 * s), ("student_symmetric", b + 0.1 * s))
        ]
        rows = hand_rows()
        results = summarize(parts.per_seed_table(rows), [], extra={"rows": rows, "curve": curve})
        md = parts.markdown_tables(results)
        self.assertIn("| 0 | 15.00 ± 7.07 | 35.00 ± 7.07 | -20.00 ± 0.00 |", md)
        self.assertIn("| 10 | 30.00 ± 7.07 | 35.00 ± 7.07 | -5.00 ± 0.00 |", md)
        self.assertNotIn("one-cycle", md)  # no config: the schedule is not named
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
        self.assertIn("One one-cycle schedule of 10 iterations", parts.markdown_tables(results))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "fig.png")
            parts.plot_performance_vs_flops(results, path)
            with open(path, "rb") as f:
                self.assertEqual(f.read(4), b"\x89PNG")


class TestSelectionTable(unittest.TestCase):
    def test_grid_and_selected_iterations(self):
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
        text = "\n".join(parts._selection_lines(selection))
        self.assertIn("| glyphs | 0 | 31.58 | 36.17 | 3e-05 |", text)
        self.assertIn("| glyphs | 24 | full | 150, 200 | 36.17, 25.00 |", text)
        self.assertIn("| glyphs | 24 | loss_abs_only | 0 | 10.00 |", text)
        self.assertLess(text.index("| full |"), text.index("| loss_abs_only |"))
        self.assertEqual(parts._selection_lines([]), [])
