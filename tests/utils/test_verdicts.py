"""Paired comparisons and verdict words (pml_extensions.utils.verdicts): hand-computed values on tiny tables."""

import math
import unittest

from pml_extensions.runner.outputs.results import summarize

M = "mean_average_precision_at_r"


class TestVerdict(unittest.TestCase):
    def test_the_one_line_verdict(self):
        from pml_extensions.utils.verdicts import verdict

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
    from pml_extensions.utils.verdicts import compare

    r = summarize(
        {"v": {s: {metric: x} for s, x in variant.items()}, "b": {s: {metric: x} for s, x in baseline.items()}}
    )
    return compare(r["variants"], "v", "b", metric)


def test_paired_difference_hand_computed():
    import pytest

    from pml_extensions.utils.verdicts import wins

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


def test_verdict_words_and_formatting():
    """One vocabulary: shown / no effect of practical size / contradicted / inconclusive (n seeds)."""
    import pytest

    from pml_extensions.utils.verdicts import VERDICTS, format_difference, format_mean_std, verdict_word

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
    from pml_extensions.utils.verdicts import verdict_word

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
    from pml_extensions.utils.verdicts import verdict_word

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
    from pml_extensions.utils.verdicts import effect_bound, verdict_word

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

    from pml_extensions.utils.verdicts import claim_verdicts, verdict_word

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
