"""The paired-difference statistics of benchmarks/bench_stats.py on hand-made tables."""

import importlib.util
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    spec = importlib.util.spec_from_file_location("bench_stats", os.path.join(ROOT, "benchmarks", "bench_stats.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paired_difference_hand_computed():
    bs = _module()
    # differences 1, 2, 6: mean 3, sample std sqrt(((−2)² + (−1)² + 3²) / 2) = sqrt(7); t_{0.975, 2} =
    # 4.302652729911275
    r = bs.paired_difference({0: 11.0, 1: 12.0, 2: 16.0}, {0: 10.0, 1: 10.0, 2: 10.0})
    assert r["differences"] == [1.0, 2.0, 6.0]
    assert r["mean_difference"] == 3.0
    assert r["std_difference"] == pytest.approx(math.sqrt(7.0), abs=1e-12)
    half = 4.302652729911275 * math.sqrt(7.0) / math.sqrt(3.0)
    assert r["ci95"] == pytest.approx([3.0 - half, 3.0 + half], abs=1e-9)
    assert r["wins"] == 3 and r["n"] == 3


def test_pairing_uses_seeds_not_order():
    bs = _module()
    # same values as above, baseline given in another order: the pairing is by seed
    r = bs.paired_difference({2: 16.0, 0: 11.0, 1: 12.0}, {1: 10.0, 2: 10.0, 0: 10.0})
    assert r["differences"] == [1.0, 2.0, 6.0]
    # an unpaired reading (sorted values) would give another answer: here baseline differs per seed
    r = bs.paired_difference({0: 1.0, 1: 2.0}, {0: 2.0, 1: 0.0})
    assert r["differences"] == [-1.0, 2.0] and r["mean_difference"] == 0.5


def test_one_seed_has_no_interval_and_errors_are_named():
    bs = _module()
    r = bs.paired_difference({0: 2.0}, {0: 1.0})
    assert r["mean_difference"] == 1.0 and all(math.isnan(v) for v in r["ci95"])
    with pytest.raises(ValueError, match="seed"):
        bs.paired_difference({0: 1.0, 3: 1.0}, {0: 1.0})
    with pytest.raises(ValueError, match=r"variant\[0\] must be finite"):
        bs.paired_difference({0: float("nan"), 1: 1.0}, {0: 1.0, 1: 1.0})
    with pytest.raises(ValueError, match=r"seed 0 must be finite"):
        bs.paired_difference({0: 1.0}, {0: float("inf")})
    with pytest.raises(ValueError, match="confidence"):
        bs.paired_difference({0: 1.0}, {0: 1.0}, confidence=1.5)


def test_summaries_and_comparisons_layout():
    bs = _module()
    variants = bs.summarize_variants(
        {"baseline": {0: {"acc": 1.0}, 1: {"acc": 3.0}}, "block": {0: {"acc": 2.0}, 1: {"acc": 5.0}}}
    )
    assert variants["baseline"]["mean"]["acc"] == 2.0
    assert variants["baseline"]["std"]["acc"] == pytest.approx(math.sqrt(2.0))
    assert variants["block"]["per_seed"] == {"0": {"acc": 2.0}, "1": {"acc": 5.0}}
    (c,) = bs.compare(variants, ["baseline", "block"], "baseline", "acc")
    assert (c["variant"], c["baseline"], c["metric"]) == ("block", "baseline", "acc")
    assert c["mean_difference"] == 1.5 and c["differences"] == [1.0, 2.0]
    # t_{0.975, 1} = 12.706204736174707, std of (1, 2) = sqrt(0.5)
    half = 12.706204736174707 * math.sqrt(0.5) / math.sqrt(2.0)
    assert c["ci95"] == pytest.approx([1.5 - half, 1.5 + half], abs=1e-9)


def test_verdict_reads_the_interval():
    bs = _module()
    assert bs.verdict({"ci95": [0.1, 2.0]}) == "reproduces"
    assert bs.verdict({"ci95": [-2.0, -0.1]}) == "opposite"
    assert bs.verdict({"ci95": [-0.1, 2.0]}) == "not shown (CI includes 0)"
    assert bs.verdict({"ci95": [-0.1, 2.0]}, "on_par") == "consistent (CI includes 0)"
    assert bs.verdict({"ci95": [0.1, 2.0]}, "on_par") == "differs"
    assert bs.verdict({"ci95": [float("nan"), float("nan")]}) == "1 seed, no CI"
    with pytest.raises(ValueError, match="claim"):
        bs.verdict({"ci95": [0.0, 1.0]}, "less")
