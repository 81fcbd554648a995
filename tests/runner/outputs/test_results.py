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
    def test_the_one_line_verdict(self):
        from pml_extensions.runner.outputs.results import verdict

        base = {"variant": "xml", "baseline": "gap", "metric": M, "mean_difference": 0.02, "n": 3}
        line = verdict({**base, "ci95": [0.01, 0.03], "smallest_effect": 0.01})
        self.assertIn("xml − gap MAP@R +0.0200, 95 % CI [+0.0100, +0.0300] over 3 seeds", line)
        self.assertTrue(line.endswith("smallest effect 0.01: shown"))
        self.assertTrue(verdict({**base, "ci95": [0.01, 0.03], "smallest_effect": 0.05}).endswith(
            "smallest effect 0.05: no effect of practical size"
        ))  # fmt: skip
        line = verdict({**base, "mean_difference": -0.02, "ci95": [-0.03, -0.01], "smallest_effect": 0.01})
        self.assertTrue(line.endswith("contradicted"))
        self.assertTrue(
            verdict({**base, "ci95": [-0.01, 0.05]}).endswith(
                "inconclusive (3 seeds) (no smallest effect of interest given)"
            )
        )
        self.assertTrue(
            verdict({**base, "ci95": None, "n": 1}).endswith("(1 seed, no interval): inconclusive (1 seed)")
        )
        boot = {**base, "ci95": [0.01, 0.03], "bootstrap_ci95": [-0.001, 0.04], "bootstrap": {"resampled": "seeds"}}
        self.assertIn("(bootstrap over seeds [-0.0010, +0.0400])", verdict(boot))


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


def test_verdict_words_and_formatting():
    """One vocabulary: shown / no effect of practical size / contradicted / inconclusive (n seeds)."""
    import pytest

    from pml_extensions.runner.outputs.results import VERDICTS, format_difference, format_mean_std, verdict_word

    def c(low, high, mean=None, n=5, **kw):
        return {"ci95": [low, high], "mean_difference": (low + high) / 2 if mean is None else mean, "n": n, **kw}

    assert verdict_word(c(0.1, 2.0), smallest_effect=0.5) == "shown"
    assert verdict_word(c(-2.0, -0.1), smallest_effect=0.5) == "contradicted"
    assert verdict_word(c(-0.1, 2.0), smallest_effect=0.5) == "inconclusive (5 seeds)"
    assert verdict_word(c(-0.1, 2.0), "on_par", 0.5) == "inconclusive (5 seeds)"
    assert verdict_word(c(-0.1, 0.4), "on_par", 0.5) == "no effect of practical size"
    assert verdict_word(c(0.6, 2.0), "on_par", 0.5) == "contradicted"
    assert verdict_word(c(-2.0, -0.6), "on_par", 0.5) == "contradicted"
    assert verdict_word(c(-2.0, -0.1), "less", 0.5) == "shown"
    assert verdict_word(c(0.1, 2.0), "less", 0.5) == "contradicted"
    assert verdict_word({"ci95": None, "mean_difference": 1.0, "n": 1}, smallest_effect=0.5) == "inconclusive (1 seed)"
    assert verdict_word({"ci95": [float("nan")] * 2, "mean_difference": 1.0, "differences": [1.0]}, "greater", 0.5) == (
        "inconclusive (1 seed)"
    )
    assert verdict_word({"ci95": [0.1, 2.0], "mean_difference": 1.0}, smallest_effect=0.5) == "shown"
    assert verdict_word({"ci95": [-0.1, 2.0], "mean_difference": 1.0}, smallest_effect=0.5) == "inconclusive"  # n?
    assert VERDICTS == ("shown", "no effect of practical size", "contradicted", "inconclusive")
    with pytest.raises(ValueError, match="claim"):
        verdict_word(c(0.0, 1.0), "bigger")
    with pytest.raises(ValueError, match="smallest effect must be a positive number"):
        verdict_word(c(0.0, 1.0), smallest_effect=0.0)
    assert format_difference({"mean_difference": -0.37, "ci95": [-2.02, 1.29]}) == "-0.37 [-2.02, +1.29]"
    assert format_difference({"mean_difference": 0.004, "ci95": None}, 3, scale=100) == "+0.400 (1 seed)"
    boot = {"mean_difference": 0.5, "ci95": [0.25, 0.75], "bootstrap_ci95": [0.125, 1.0]}
    assert format_difference(boot, 3, interval="bootstrap_ci95") == "+0.500 [+0.125, +1.000]"
    with pytest.raises(ValueError, match="interval"):
        format_difference(boot, interval="t")
    assert format_mean_std({"mean": {"a": 83.27}, "std": {"a": 0.35}}, "a") == "83.27 ± 0.35"
    assert format_mean_std({"mean": {"a": 83.27}, "std": {"a": None}}, "a") == "83.27 ± –"


def test_every_verdict_branch_of_a_greater_claim():
    """δ = 1; p̃: the Holm-adjusted p-value (None: the interval alone decides)."""
    from pml_extensions.runner.outputs.results import verdict_word

    def word(low, high, mean, p_holm=None, n=10):
        return verdict_word({"ci95": [low, high], "mean_difference": mean, "n": n}, "greater", 1.0, p_holm=p_holm)

    assert word(1.5, 3.5, 2.5) == "shown"
    assert word(0.2, 3.5, 1.0) == "shown"  # m reaches δ exactly
    assert word(1.5, 3.5, 2.5, p_holm=0.049) == "shown"
    assert word(1.5, 3.5, 2.5, p_holm=0.05) == "inconclusive (10 seeds)"  # excludes 0, but not after Holm
    assert word(0.2, 1.5, 0.6) == "inconclusive (10 seeds)"  # excludes 0 and touches δ, the estimate is below δ
    assert word(0.2, 0.9, 0.6) == "no effect of practical size"  # excludes 0, within ±δ
    assert word(-0.9, 0.9, 0.0) == "no effect of practical size"
    assert word(-1.0, 0.5, 0.0) == "inconclusive (10 seeds)"  # within ±δ is strict
    assert word(-3.5, -1.5, -2.5) == "contradicted"
    assert word(-3.5, -1.5, -2.5, p_holm=0.2) == "inconclusive (10 seeds)"
    assert word(-1.5, -0.2, -0.6) == "inconclusive (10 seeds)"
    assert word(-0.9, -0.2, -0.6) == "no effect of practical size"
    assert word(-0.5, 2.0, 0.7) == "inconclusive (10 seeds)"
    assert word(1.5, 3.5, 2.5, n=1) == "inconclusive (1 seed)"


def test_the_issues_cases():
    """+0.12 [+0.03, +0.22] MAP@R points (20 seeds) under δ = 1 point is no effect of practical size, not shown;
    −0.76 [−15.89, +14.36] over 3 seeds is inconclusive; a 0.1-point effect is never shown, whatever its interval."""
    from pml_extensions.runner.outputs.results import verdict_word

    proxy = {"mean_difference": 0.0012, "ci95": [0.0003, 0.0022], "n": 20, "p_holm": 0.014}  # fractions
    assert verdict_word(proxy, smallest_effect=0.01) == "no effect of practical size"
    main_job = {"mean_difference": -0.0076, "ci95": [-0.1589, 0.1436], "n": 3}
    assert verdict_word(main_job, smallest_effect=0.01) == "inconclusive (3 seeds)"
    for low in (0.001, 0.05, 0.09):
        for high in (0.11, 0.5, 1.0, 5.0):
            for claim in ("greater", "less", "on_par"):
                for p in (None, 0.0001):
                    assert (
                        verdict_word({"mean_difference": 0.1, "ci95": [low, high], "n": 50}, claim, 1.0, p_holm=p)
                        != "shown"
                    )


def test_the_verdict_reads_the_envelope_of_both_intervals():
    from pml_extensions.runner.outputs.results import effect_bound, verdict_word

    c = {"mean_difference": 2.0, "ci95": [1.0, 3.0], "n": 5, "smallest_effect": 1.0}
    assert verdict_word(c) == "shown"
    assert verdict_word({**c, "bootstrap_ci95": [-0.5, 4.0]}) == "inconclusive (5 seeds)"  # the bootstrap reaches 0
    assert effect_bound({**c, "bootstrap_ci95": [-0.5, 4.0]}) == 4.0
    narrow = {"mean_difference": 0.1, "ci95": [-0.5, 0.7], "bootstrap_ci95": [-0.2, 0.95], "n": 5}
    assert verdict_word(narrow, smallest_effect=1.0) == "no effect of practical size"
    assert verdict_word({**narrow, "bootstrap_ci95": [-0.2, 1.05]}, smallest_effect=1.0) == "inconclusive (5 seeds)"


def test_claim_verdicts_correct_a_table_with_holm():
    """Two claims whose t-tests each give p = 0.03: each alone is shown; together Holm makes both 0.06."""
    import pytest
    from scipy import stats

    from pml_extensions.runner.outputs.results import claim_verdicts, verdict_word

    n, std = 5, 1.0
    t = stats.t.isf(0.015, n - 1)
    mean = t * std / math.sqrt(n)  # two-sided p = 0.03
    half = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
    c = {"mean_difference": mean, "std": std, "n": n, "ci95": [mean - half, mean + half]}
    assert c["ci95"][0] > 0 and mean > 0.5
    assert verdict_word(c, smallest_effect=0.5) == "shown"
    assert claim_verdicts([c], smallest_effects=0.5) == ["shown"]
    assert claim_verdicts([c, c], smallest_effects=0.5) == ["inconclusive (5 seeds)"] * 2
    assert claim_verdicts([c, c], smallest_effects=[0.5, None]) == ["inconclusive (5 seeds)"] * 2
    assert (
        claim_verdicts([c, dict(c, mean_difference=-mean, ci95=[-mean - half, -mean + half])], "on_par", 0.5)
        == ["inconclusive (5 seeds)"] * 2
    )
    assert claim_verdicts([c], "less", 0.5) == ["contradicted"]
    with pytest.raises(ValueError, match="2 entries for 1 comparisons"):
        claim_verdicts([c], smallest_effects=[0.5, 0.5])


# ------------------------------------------------------------------------------------------------------------------
# claims in results.json: per-class data, smallest effects, Holm over the table, the tables rebuilt from the file


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
