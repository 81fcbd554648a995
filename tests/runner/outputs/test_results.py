import json
import math
import tempfile
import unittest

from pml_extensions.runner.outputs.results import render_markdown, summarize, write_results

M = "mean_average_precision_at_r"


def table():
    return {
        "gap": {
            0: {M: 0.50, "precision_at_1": 0.6},
            1: {M: 0.49, "precision_at_1": 0.7},
            2: {M: 0.52, "precision_at_1": 0.8},
        },
        "xml": {
            0: {M: 0.52, "precision_at_1": 0.6},
            1: {M: 0.50, "precision_at_1": 0.6},
            2: {M: 0.55, "precision_at_1": 0.6},
        },
    }


class TestResults(unittest.TestCase):
    def test_layout_and_numbers(self):
        r = summarize(table(), comparisons=[("xml", "gap")], extra={"dataset": "glyphs"})
        self.assertEqual(set(r), {"variants", "comparisons", "dataset"})
        self.assertEqual(r["variants"]["gap"]["per_seed"]["1"][M], 0.49)
        self.assertAlmostEqual(r["variants"]["gap"]["mean"][M], 1.51 / 3, places=12)
        self.assertAlmostEqual(r["variants"]["gap"]["std"]["precision_at_1"], 0.1, places=12)
        (c,) = r["comparisons"]
        self.assertEqual((c["variant"], c["baseline"], c["metric"]), ("xml", "gap", M))
        self.assertAlmostEqual(c["mean_difference"], 0.02, places=12)
        half = 4.302653 * 0.01 / math.sqrt(3)
        self.assertAlmostEqual(c["ci95"][0], 0.02 - half, places=6)
        self.assertEqual(c["seeds"], ["0", "1", "2"])

    def test_markdown_and_files(self):
        r = summarize(table(), comparisons=[("xml", "gap")], metrics=[M, "precision_at_1"])
        md = render_markdown(r, metrics=[M, "precision_at_1"])
        self.assertIn("| xml | 0.5233 ± 0.0252 | 0.6000 ± 0.0000 | 0.5200, 0.5000, 0.5500 |", md)
        self.assertIn("| xml − gap | MAP@R | +0.0200 | [-0.0048, +0.0448] | +0.0200, +0.0100, +0.0300 | no |", md)
        self.assertIn("| xml − gap | P@1 | -0.1000 |", md)
        with tempfile.TemporaryDirectory() as d:
            jp, mp = write_results(d, r, header="Dataset glyphs.")
            with open(jp) as f:
                self.assertEqual(json.load(f)["comparisons"][0]["ci95"], r["comparisons"][0]["ci95"])
            with open(mp) as f:
                self.assertTrue(f.read().startswith("Dataset glyphs.\n"))

    def test_single_seed_has_no_interval(self):
        r = summarize({"a": {0: {M: 0.3}}, "b": {0: {M: 0.2}}}, comparisons=[("a", "b")])
        self.assertIsNone(r["comparisons"][0]["ci95"])
        self.assertIsNone(r["variants"]["a"]["std"][M])
        self.assertIn("n/a (1 seed)", render_markdown(r))

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "unknown variant 'nope'"):
            summarize(table(), comparisons=[("nope", "gap")])
        bad = table()
        del bad["xml"][2]
        with self.assertRaisesRegex(ValueError, r"only in baseline \['2'\]"):
            summarize(bad, comparisons=[("xml", "gap")])
        bad = table()
        del bad["xml"][1][M]
        with self.assertRaisesRegex(ValueError, "missing for seeds"):
            summarize(bad)


class TestVerdict(unittest.TestCase):
    def test_three_outcomes(self):
        from pml_extensions.runner.outputs.results import verdict

        base = {"variant": "xml", "baseline": "gap", "metric": M, "mean_difference": 0.02, "n": 3}
        self.assertTrue(verdict({**base, "ci95": [0.01, 0.03]}).endswith("reproduced (the interval lies above 0)"))
        self.assertIn(
            "xml − gap MAP@R +0.0200, 95 % CI [+0.0100, +0.0300] over 3 seeds", verdict({**base, "ci95": [0.01, 0.03]})
        )
        self.assertTrue(verdict({**base, "ci95": [-0.03, -0.01]}).endswith("contradicted (the interval lies below 0)"))
        self.assertTrue(
            verdict({**base, "ci95": [-0.01, 0.05]}).endswith("not shown at this scale (the interval contains 0)")
        )
        self.assertTrue(verdict({**base, "ci95": None, "n": 1}).endswith("not shown"))
