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


# ------------------------------------------------------------------------------------------------------------------
# The paired statistics the benchmarks used to take from benchmarks/bench_stats.py (merged here, issue 20 item 4): the
# same hand-computed values through the runner's compare / summarize / verdict_word.


def _pair(variant, baseline, metric="acc"):
    from pml_extensions.runner.outputs.results import compare

    r = summarize(
        {"v": {s: {metric: x} for s, x in variant.items()}, "b": {s: {metric: x} for s, x in baseline.items()}}
    )
    return compare(r["variants"], "v", "b", metric)


def test_paired_difference_hand_computed():
    import pytest

    from pml_extensions.runner.outputs.results import wins

    # differences 1, 2, 6: mean 3, sample std sqrt(((−2)² + (−1)² + 3²) / 2) = sqrt(7); t_{0.975, 2} = 4.302652729911275
    c = _pair({0: 11.0, 1: 12.0, 2: 16.0}, {0: 10.0, 1: 10.0, 2: 10.0})
    assert c["differences"] == [1.0, 2.0, 6.0]
    assert c["mean_difference"] == 3.0
    assert c["std"] == pytest.approx(math.sqrt(7.0), abs=1e-12)
    half = 4.302652729911275 * math.sqrt(7.0) / math.sqrt(3.0)
    assert c["ci95"] == pytest.approx([3.0 - half, 3.0 + half], abs=1e-9)
    assert wins(c) == 3 and c["n"] == 3


def test_pairing_uses_seeds_not_order():
    # same values as above, baseline given in another order: the pairing is by seed
    c = _pair({2: 16.0, 0: 11.0, 1: 12.0}, {1: 10.0, 2: 10.0, 0: 10.0})
    assert c["differences"] == [1.0, 2.0, 6.0]
    # an unpaired reading (sorted values) would give another answer: here baseline differs per seed
    c = _pair({0: 1.0, 1: 2.0}, {0: 2.0, 1: 0.0})
    assert c["differences"] == [-1.0, 2.0] and c["mean_difference"] == 0.5


def test_one_seed_has_no_interval_and_errors_are_named():
    import pytest

    from pml_extensions.utils.paired_stats import paired_difference

    c = _pair({0: 2.0}, {0: 1.0})
    assert c["mean_difference"] == 1.0 and c["ci95"] is None and c["std"] is None
    with pytest.raises(ValueError, match="seed"):
        _pair({0: 1.0, 3: 1.0}, {0: 1.0})
    with pytest.raises(ValueError, match="finite"):
        _pair({0: float("nan"), 1: 1.0}, {0: 1.0, 1: 1.0})
    with pytest.raises(ValueError, match="finite"):
        _pair({0: 1.0}, {0: float("inf")})
    with pytest.raises(ValueError, match="confidence"):
        paired_difference({0: 1.0, 1: 2.0}, {0: 1.0, 1: 1.0}, confidence=1.5)


def test_summaries_and_comparisons_layout():
    import pytest

    from pml_extensions.runner.outputs.results import compare

    variants = summarize({"baseline": {0: {"acc": 1.0}, 1: {"acc": 3.0}}, "block": {0: {"acc": 2.0}, 1: {"acc": 5.0}}})[
        "variants"
    ]
    assert variants["baseline"]["mean"]["acc"] == 2.0
    assert variants["baseline"]["std"]["acc"] == pytest.approx(math.sqrt(2.0))
    assert variants["block"]["per_seed"] == {"0": {"acc": 2.0}, "1": {"acc": 5.0}}
    c = compare(variants, "block", "baseline", "acc")
    assert (c["variant"], c["baseline"], c["metric"]) == ("block", "baseline", "acc")
    assert c["mean_difference"] == 1.5 and c["differences"] == [1.0, 2.0]
    # t_{0.975, 1} = 12.706204736174707, std of (1, 2) = sqrt(0.5)
    half = 12.706204736174707 * math.sqrt(0.5) / math.sqrt(2.0)
    assert c["ci95"] == pytest.approx([1.5 - half, 1.5 + half], abs=1e-9)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        compare(variants, "nope", "baseline", "acc")
    with pytest.raises(ValueError, match="has no 'loss'"):
        compare(variants, "block", "baseline", "loss")


def test_verdict_reads_the_interval():
    """One vocabulary: reproduced / contradicted / not shown, and consistent for a claim of no difference."""
    import pytest

    from pml_extensions.runner.outputs.results import VERDICTS, format_difference, format_mean_std, verdict_word

    assert verdict_word({"ci95": [0.1, 2.0]}) == "reproduced"
    assert verdict_word({"ci95": [-2.0, -0.1]}) == "contradicted"
    assert verdict_word({"ci95": [-0.1, 2.0]}) == "not shown"
    assert verdict_word({"ci95": [-0.1, 2.0]}, "on_par") == "consistent"
    assert verdict_word({"ci95": [0.1, 2.0]}, "on_par") == "contradicted"
    assert verdict_word({"ci95": [-2.0, -0.1]}, "less") == "reproduced"
    assert verdict_word({"ci95": [0.1, 2.0]}, "less") == "contradicted"
    assert verdict_word({"ci95": None}) == "not shown"
    assert verdict_word({"ci95": [float("nan"), float("nan")]}) == "not shown"
    assert set(VERDICTS) == {"reproduced", "contradicted", "not shown", "consistent"}
    with pytest.raises(ValueError, match="claim"):
        verdict_word({"ci95": [0.0, 1.0]}, "bigger")
    assert format_difference({"mean_difference": -0.37, "ci95": [-2.02, 1.29]}) == "-0.37 [-2.02, +1.29]"
    assert format_difference({"mean_difference": 0.004, "ci95": None}, 3, scale=100) == "+0.400 (1 seed)"
    assert format_mean_std({"mean": {"a": 83.27}, "std": {"a": 0.35}}, "a") == "83.27 ± 0.35"
    assert format_mean_std({"mean": {"a": 83.27}, "std": {"a": None}}, "a") == "83.27 ± –"
