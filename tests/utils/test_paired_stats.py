import itertools
import math
import unittest
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from pml_extensions.utils.paired_stats import (
    bootstrap_difference,
    bootstrap_p_value,
    holm,
    mean_std,
    paired_difference,
    paired_t_p_value,
    per_class_metric,
)


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


# ------------------------------------------------------------------------------------------------------------------
# the paired bootstrap over seeds and test classes, its p-value, and Holm's correction

# 3 seeds × 2 classes, class "b" with half the queries of "a" (so a resampled metric is a ratio, not a mean of means)
VARIANT = {0: {"a": [3.0, 4], "b": [1.0, 2]}, 1: {"a": [2.0, 4], "b": [2.0, 2]}, 2: {"a": [1.0, 4], "b": [0.5, 2]}}
BASELINE = {0: {"a": [2.0, 4], "b": [1.0, 2]}, 1: {"a": [2.5, 4], "b": [0.5, 2]}, 2: {"a": [1.0, 4], "b": [1.5, 2]}}


def _enumerated(variant, baseline):
    """The exact bootstrap distribution in float64: every ordered draw of n seeds and m classes with replacement
    (n^n · m^m equally likely outcomes), each resampled difference computed from its definition."""
    seeds, classes = sorted(variant), sorted(variant[0])
    n, m = len(seeds), len(classes)
    values = []
    for seed_draw in itertools.product(seeds, repeat=n):
        for class_draw in itertools.product(classes, repeat=m):
            d = 0.0
            for s in seed_draw:
                arm = [sum(x[s][c][0] for c in class_draw) / sum(x[s][c][1] for c in class_draw) for x in (variant,
                       baseline)]  # fmt: skip
                d += arm[0] - arm[1]
            values.append(d / n)
    return np.array(values)


def _support(values, tol=1e-12):
    """Distinct values (merged within ``tol``) -> probability."""
    out = {}
    for v in sorted(values):
        key = next((k for k in out if abs(k - v) <= tol), v)
        out[key] = out.get(key, 0) + 1
    return {k: c / len(values) for k, c in out.items()}


def _matches_exact(sampled, exact):
    """Every resampled value is a value of the exact distribution, and each value's frequency is within 4.5 binomial
    standard errors of its exact probability."""
    support = _support(exact)
    keys = np.array(sorted(support))
    nearest = keys[np.abs(sampled[:, None] - keys[None, :]).argmin(1)]
    assert np.abs(nearest - sampled).max() <= 1e-12
    counts = Counter(nearest.tolist())
    B = len(sampled)
    for k, p in support.items():
        assert abs(counts.get(k, 0) / B - p) <= 4.5 * np.sqrt(p * (1 - p) / B) + 1e-12, (k, p)


def test_per_class_metric_is_sum_over_count():
    assert per_class_metric({"a": [3.0, 4], "b": [1.0, 2]}) == 4.0 / 6.0
    with pytest.raises(ValueError, match="count must be positive"):
        per_class_metric({"a": [1.0, 0]})
    with pytest.raises(ValueError, match=r"must be \[sum, count\]"):
        per_class_metric({"a": [1.0]})
    with pytest.raises(ValueError, match="finite"):
        per_class_metric({"a": [float("nan"), 1]})


def test_bootstrap_over_seeds_and_classes_against_a_full_enumeration():
    # observed, by hand: seed 0: 4/6 − 3/6, seed 1: 4/6 − 3/6, seed 2: 1.5/6 − 2.5/6 -> (1/6 + 1/6 − 1/6) / 3 = 1/18
    r = bootstrap_difference(VARIANT, BASELINE, per_class=True, n_resamples=20000, seed=3, return_distribution=True)
    assert r["mean_difference"] == pytest.approx(1 / 18, abs=1e-15)
    assert (r["resampled"], r["method"], r["n_resamples"], r["seed"], r["n_seeds"], r["n_classes"]) == (
        "seeds and test classes", "percentile", 20000, 3, 3, 2
    )  # fmt: skip
    exact = _enumerated(VARIANT, BASELINE)
    assert len(exact) == 3**3 * 2**2
    _matches_exact(r["distribution"], exact)
    # the interval is the distribution's 2.5 % and 97.5 % quantiles, the p-value its two tails
    assert r["ci"] == list(np.quantile(r["distribution"], [0.025, 0.975]))
    assert r["p_value"] == bootstrap_p_value(r["distribution"])
    # and both are close to the exact distribution's: p = 2 · P(d* ≤ 0) here (the smaller tail)
    exact_p = 2 * min((exact <= 0).mean(), (exact >= 0).mean())
    assert r["p_value"] == pytest.approx(exact_p, abs=0.02)
    # seeded: the same call gives the same numbers; another seed other numbers
    again = bootstrap_difference(VARIANT, BASELINE, per_class=True, n_resamples=20000, seed=3)
    assert again["ci"] == r["ci"] and again["p_value"] == r["p_value"]
    assert bootstrap_difference(VARIANT, BASELINE, per_class=True, n_resamples=20000, seed=4)["p_value"] != r["p_value"]


def test_bootstrap_over_classes_of_one_seed_by_hand():
    # one seed, class differences 1 (a) and 0 (b), one query each: class draws aa, ab, ba, bb give 1, 0.5, 0.5, 0
    v, b = {0: {"a": [1.0, 1], "b": [0.0, 1]}}, {0: {"a": [0.0, 1], "b": [0.0, 1]}}
    r = bootstrap_difference(v, b, per_class=True, n_resamples=4000, seed=0, return_distribution=True)
    _matches_exact(r["distribution"], np.array([1.0, 0.5, 0.5, 0.0]))
    assert r["ci"] == [0.0, 1.0]  # a quarter of the mass on each end
    zeros = int((r["distribution"] <= 0).sum())
    assert r["p_value"] == 2 * (zeros + 1) / 4001 and r["p_value"] == pytest.approx(0.5, abs=0.05)


def test_bootstrap_over_seeds_only_is_scipys_against_a_full_enumeration():
    variant, baseline = {0: 11.0, 1: 12.0, 2: 16.0}, {0: 10.0, 1: 10.0, 2: 10.0}  # differences 1, 2, 6
    r = bootstrap_difference(variant, baseline, n_resamples=20000, seed=0, return_distribution=True)
    assert r["resampled"] == "seeds" and r["n_classes"] is None and r["mean_difference"] == 3.0
    exact = np.array([np.mean(draw) for draw in itertools.product([1.0, 2.0, 6.0], repeat=3)])
    _matches_exact(r["distribution"], exact)
    # the interval is scipy.stats.bootstrap's percentile interval with the same seeded Generator
    ref = stats.bootstrap(
        (np.array([1.0, 2.0, 6.0]),), np.mean, n_resamples=20000, method="percentile", rng=np.random.default_rng(0)
    )
    assert r["ci"] == [ref.confidence_interval.low, ref.confidence_interval.high]
    # P(mean of the draw ≤ 0) = 0: p is the floor 2 / (B + 1)
    assert r["p_value"] == 2 / 20001


def test_bootstrap_p_value_and_t_p_value_by_hand():
    assert bootstrap_p_value([1.0, -1.0, 2.0, 3.0]) == 2 * (1 + 1) / 5
    assert bootstrap_p_value([0.0, 0.0]) == 1.0  # both tails hold everything
    assert bootstrap_p_value([-1.0, -2.0, -3.0]) == 0.5  # 2 · (0 + 1) / 4
    # 2 degrees of freedom: P(|T| ≥ t) = 1 − t / sqrt(t² + 2); differences 2, 2.5, 3: t = 2.5 / (0.5 / √3)
    t = 2.5 / (0.5 / math.sqrt(3))
    assert paired_t_p_value(2.5, 0.5, 3) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-12)
    assert paired_t_p_value(1.0, None, 1) is None and paired_t_p_value(0.0, 0.0, 3) == 1.0
    assert paired_t_p_value(0.5, 0.0, 3) == 0.0


def test_bootstrap_errors():
    with pytest.raises(ValueError, match=r"only in variant \[3\]"):
        bootstrap_difference({0: 1.0, 3: 1.0}, {0: 1.0, 1: 1.0})
    with pytest.raises(ValueError, match="at least 2 paired seeds, got 1"):
        bootstrap_difference({0: 1.0}, {0: 0.5})
    with pytest.raises(ValueError, match="same classes"):
        bootstrap_difference({0: {"a": [1, 1]}}, {0: {"b": [1, 1]}}, per_class=True)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_difference({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, n_resamples=10)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_difference({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, confidence=95)
    with pytest.raises(ValueError, match="seed must be an int"):
        bootstrap_difference({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, seed=None)
    with pytest.raises(TypeError, match="mapping seed"):
        bootstrap_difference([1.0], {0: 1.0}, per_class=True)
    with pytest.raises(ValueError, match="non-empty mapping class"):
        bootstrap_difference({0: {}}, {0: {}}, per_class=True)


def test_holm_against_hand_worked_examples():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running maximum 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    # 0.01·5, 0.02·4, 0.03·3, 0.04·2, 0.05·1 = 0.05, 0.08, 0.09, 0.08, 0.05 -> 0.05, 0.08, 0.09, 0.09, 0.09
    assert holm([0.01, 0.02, 0.03, 0.04, 0.05]) == pytest.approx([0.05, 0.08, 0.09, 0.09, 0.09], abs=1e-15)
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert holm([0.014]) == [0.014]  # one claim: unchanged
    assert holm([0.02, None, 0.04]) == [0.04, None, 0.04]  # None is outside the family (k = 2)
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"p_values\[1\]"):
        holm([0.1, 1.5])
