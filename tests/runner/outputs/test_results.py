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


def test_summaries_and_comparisons_layout():
    import pytest

    from pml_extensions.utils.verdicts import compare

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


def _per_class():
    """3 seeds × 2 test classes for gap and xml on MAP@R; per_seed is Σ sum / Σ count of each run."""
    classes = {
        "gap": {0: {"a": [2.0, 4], "b": [1.0, 2]}, 1: {"a": [2.5, 4], "b": [0.5, 2]}},
        "xml": {0: {"a": [3.0, 4], "b": [1.0, 2]}, 1: {"a": [2.0, 4], "b": [2.0, 2]}},
    }
    classes["gap"][2] = {"a": [1.0, 4], "b": [1.5, 2]}
    classes["xml"][2] = {"a": [1.0, 4], "b": [0.5, 2]}
    per_seed = {
        v: {s: {M: sum(p[0] for p in rows.values()) / sum(p[1] for p in rows.values())} for s, rows in seeds.items()}
        for v, seeds in classes.items()
    }
    return per_seed, {v: {s: {M: rows} for s, rows in seeds.items()} for v, seeds in classes.items()}


def test_a_claim_with_per_class_data_gets_both_intervals_p_values_and_a_verdict():
    import pytest

    from pml_extensions.utils.paired_stats import bootstrap_difference, paired_t_p_value

    per_seed, per_class = _per_class()
    r = summarize(per_seed, [("xml", "gap")], metrics=[M], per_class=per_class, smallest_effects={M: 0.01},
                  n_resamples=2000, bootstrap_seed=7)  # fmt: skip
    (c,) = r["comparisons"]
    assert c["mean_difference"] == pytest.approx(1 / 18, abs=1e-15)  # (1/6 + 1/6 − 1/6) / 3
    ref = bootstrap_difference(
        {s: per_class["xml"][s][M] for s in range(3)},
        {s: per_class["gap"][s][M] for s in range(3)},
        per_class=True,
        n_resamples=2000,
        seed=7,
    )
    assert c["bootstrap_ci95"] == ref["ci"] and c["p_value_bootstrap"] == ref["p_value"]
    assert c["bootstrap"] == {"resampled": "seeds and test classes", "method": "percentile", "n_resamples": 2000,
                              "seed": 7, "n_classes": 2}  # fmt: skip
    assert c["p_value_t"] == paired_t_p_value(c["mean_difference"], c["std"], 3)
    assert c["p_value"] == max(c["p_value_t"], c["p_value_bootstrap"]) and c["p_holm"] == c["p_value"]  # one claim
    assert (c["claim"], c["smallest_effect"], c["verdict"]) == ("greater", 0.01, "inconclusive (3 seeds)")
    assert r["per_class"]["xml"]["0"][M] == {"a": [3.0, 4.0], "b": [1.0, 2.0]}  # stored: anyone can recompute
    assert c["ci95"] is not None and set(c) >= {"variant", "baseline", "metric", "std", "n", "seeds", "differences"}


def test_without_per_class_data_the_bootstrap_runs_over_seeds_and_says_so():
    per_seed, _ = _per_class()
    r = summarize(per_seed, [("xml", "gap")], metrics=[M], smallest_effects=0.01)
    (c,) = r["comparisons"]
    assert c["bootstrap"]["resampled"] == "seeds" and c["bootstrap"]["n_classes"] is None
    assert "per_class" not in r
    md = render_markdown(r, metrics=[M])
    assert "(seeds only)" in md and "smallest effect δ" in md and "inconclusive (3 seeds)" in md
    # no δ and no per-class data: the layout of before, nothing added
    plain = summarize(per_seed, [("xml", "gap")], metrics=[M])["comparisons"][0]
    assert set(plain) == {
        "variant",
        "baseline",
        "metric",
        "mean_difference",
        "std",
        "n",
        "seeds",
        "differences",
        "ci95",
    }


def test_holm_runs_over_every_claim_of_a_result():
    from pml_extensions.utils.paired_stats import holm

    per_seed = {
        "b": {s: {"m": 0.0, "n": 0.0} for s in range(3)},
        "A": {0: {"m": 2.0, "n": 0.10}, 1: {"m": 2.5, "n": 0.12}, 2: {"m": 3.0, "n": 0.14}},
    }
    r = summarize(per_seed, [("A", "b")], metrics=["m", "n"], smallest_effects={"m": 1.0, ("A", "b", "n"): 0.05},
                  claims={"n": "on_par"})  # fmt: skip
    cm, cn = r["comparisons"]
    assert [cm["p_holm"], cn["p_holm"]] == holm([cm["p_value"], cn["p_value"]])
    assert cm["p_holm"] == 2 * min(cm["p_value"], cn["p_value"])  # the smaller p of two, doubled
    assert (cm["verdict"], cn["claim"], cn["verdict"]) == ("shown", "on_par", "contradicted")  # 0.12 ≥ 0.05
    r = summarize(per_seed, [("A", "b")], metrics=["m", "n"], smallest_effects={"m": 1.0})  # one claim, one family
    assert r["comparisons"][0]["p_holm"] == r["comparisons"][0]["p_value"] and "verdict" not in r["comparisons"][1]


def test_claim_errors_are_one_line():
    import pytest

    per_seed, per_class = _per_class()
    with pytest.raises(ValueError, match="smallest effect must be a positive number"):
        summarize(per_seed, [("xml", "gap")], metrics=[M], smallest_effects=-1.0)
    with pytest.raises(ValueError, match="claim must be one of"):
        summarize(per_seed, [("xml", "gap")], metrics=[M], smallest_effects=0.01, claims="bigger")
    per_class["xml"][1][M]["a"] = [2.5, 4]
    with pytest.raises(
        ValueError, match=r"per_class\['xml'\]\['1'\]\['mean_average_precision_at_r'\]: Σ sum / Σ count"
    ):
        summarize(per_seed, [("xml", "gap")], metrics=[M], per_class=per_class)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        summarize(per_seed, per_class={"nope": {}})
    with pytest.raises(ValueError, match="reserved"):
        summarize(per_seed, extra={"per_class": 1})


def test_the_tables_are_rebuilt_from_results_json_alone():
    from pml_extensions.runner.outputs.results import results_blocks, results_tables
    from pml_extensions.runner.outputs.tables import Items, Table, to_html, to_markdown

    per_seed, per_class = _per_class()
    r = summarize(per_seed, [("xml", "gap")], metrics=[M], per_class=per_class, smallest_effects=0.01)
    footer = [Items(["one", "two"], caption="Notes:"), Table(["a"], [["1"]], numeric=[True])]
    with tempfile.TemporaryDirectory() as d:
        jp, mp = write_results(d, r, metrics=[M], header="Dataset `glyphs`.", footer=footer, decimals=3)
        stored, md = json.load(open(jp)), open(mp).read()
    assert "text" not in r  # the caller's dict is left alone
    assert stored["text"]["header"] == ["Dataset `glyphs`."] and stored["text"]["decimals"] == 3
    assert stored["text"]["metrics"] == [M]
    assert to_markdown(results_blocks(stored)) == md  # results.md is the file's blocks
    assert md.startswith("Dataset `glyphs`.\n\n| variant |") and md.endswith(
        "Notes:\n- one\n- two\n\n| a |\n|---|\n| 1 |\n"
    )
    claims = results_tables(stored)[1]
    assert claims.columns[-1] == "verdict" and claims.rows[0][-1] == "inconclusive (3 seeds)"
    assert claims.rows[0][:5] == ["xml − gap", "MAP@R", "greater", "0.01", "+0.056"]
    assert "Holm's adjustment over the 1 claim of this table" in claims.notes[0]
    page = to_html(results_blocks(stored))
    assert "<p>Dataset <code>glyphs</code>.</p>" in page and "<td class='num'>+0.056</td>" in page
    assert "|---|" not in page and "<li>one</li>" in page


def test_hand_checked_example():
    """Points; δ = 1; three seeds; differences A: 2, 2.5, 3; B: 0.5, 1, 1.5; C: 0.10, 0.12, 0.14 (docs/report.md)."""
    per_seed = {
        "b": {s: {"m": 0.0} for s in range(3)},
        "A": {0: {"m": 2.0}, 1: {"m": 2.5}, 2: {"m": 3.0}},
        "B": {0: {"m": 0.5}, 1: {"m": 1.0}, 2: {"m": 1.5}},
        "C": {0: {"m": 0.10}, 1: {"m": 0.12}, 2: {"m": 0.14}},
    }
    r = summarize(per_seed, [("A", "b"), ("B", "b"), ("C", "b")], metrics=["m"], smallest_effects={"m": 1.0})
    assert [c["verdict"] for c in r["comparisons"]] == [
        "shown",
        "inconclusive (3 seeds)",
        "no effect of practical size",
    ]
    assert [round(c["p_holm"], 4) for c in r["comparisons"]] == [0.0274, 0.0742, 0.0274]
    assert [round(x, 3) for x in r["comparisons"][0]["ci95"]] == [1.258, 3.742]
