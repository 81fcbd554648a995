import math
import unittest

from pml_extensions.utils.paired_stats import mean_std, paired_difference


class TestPairedDifference(unittest.TestCase):
    def test_ci_on_hand_made_table(self):
        # differences 0.02, 0.01, 0.03: mean 0.02, sample std 0.01; t_{0.975, 2} = 4.302653 (t table)
        variant = {0: 0.52, 1: 0.50, 2: 0.55}
        baseline = {2: 0.52, 0: 0.50, 1: 0.49}  # order of keys does not matter: matched by seed
        r = paired_difference(variant, baseline)
        self.assertEqual(r["seeds"], [0, 1, 2])
        self.assertEqual(r["n"], 3)
        self.assertAlmostEqual(r["mean_difference"], 0.02, places=12)
        self.assertAlmostEqual(r["std"], 0.01, places=12)
        half = 4.302653 * 0.01 / math.sqrt(3)
        self.assertAlmostEqual(r["ci"][0], 0.02 - half, places=6)
        self.assertAlmostEqual(r["ci"][1], 0.02 + half, places=6)

    def test_ci_four_seeds_and_other_level(self):
        # differences 1, 2, 3, 4: mean 2.5, std sqrt(5/3); t_{0.975, 3} = 3.182446, t_{0.95, 3} = 2.353363
        r = paired_difference({s: float(s + 1) for s in range(4)}, {s: 0.0 for s in range(4)})
        half = 3.182446 * math.sqrt(5 / 3) / 2
        self.assertAlmostEqual(r["ci"][0], 2.5 - half, places=5)
        self.assertAlmostEqual(r["ci"][1], 2.5 + half, places=5)
        r90 = paired_difference({s: float(s + 1) for s in range(4)}, {s: 0.0 for s in range(4)}, confidence=0.9)
        self.assertAlmostEqual(r90["ci"][1], 2.5 + 2.353363 * math.sqrt(5 / 3) / 2, places=5)

    def test_constant_difference_gives_point_interval(self):
        r = paired_difference({0: 1.5, 1: 2.5}, {0: 1.0, 1: 2.0})
        self.assertEqual(r["ci"], [0.5, 0.5])

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, r"only in variant \[3\], only in baseline \[2\]"):
            paired_difference({0: 1.0, 1: 1.0, 3: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0})
        with self.assertRaisesRegex(ValueError, "at least 2 paired seeds, got 1"):
            paired_difference({0: 1.0}, {0: 0.5})
        with self.assertRaisesRegex(ValueError, "must be finite"):
            paired_difference({0: float("nan"), 1: 1.0}, {0: 1.0, 1: 1.0})
        with self.assertRaisesRegex(ValueError, "confidence"):
            paired_difference({0: 1.0, 1: 2.0}, {0: 1.0, 1: 1.0}, confidence=95)
        with self.assertRaisesRegex(TypeError, "mapping seed -> value"):
            paired_difference([1.0, 2.0], {0: 1.0, 1: 1.0})

    def test_mean_std(self):
        self.assertEqual(mean_std([1.0, 3.0]), {"mean": 2.0, "std": math.sqrt(2.0), "n": 2})
        self.assertEqual(mean_std([4.0]), {"mean": 4.0, "std": None, "n": 1})
        with self.assertRaisesRegex(ValueError, "at least one"):
            mean_std([])
