"""The localisation benchmark's tables (benchmarks/localization.py) on hand-made units: both conventions per method,
the paired CIs of the protocol's statistics, the claims in the runner's verdict vocabulary."""

import importlib.util
import os

import pytest

from benchmarks.protocols.localization import method_statistics, variant_statistics
from tests.benchmarks.protocols.localization.loc_testing import hand_units

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def loc():
    spec = importlib.util.spec_from_file_location("localization", os.path.join(ROOT, "benchmarks", "localization.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results():
    units, runs = hand_units()
    seeds = [0, 1, 2]
    return variant_statistics(
        units,
        seeds,
        [("triplet", "ms")],
        extra={
            "seeds": seeds,
            "device": "cpu",
            "num_epochs": 1,
            "iterations_per_epoch": 1,
            "batch_size": 32,
            "methods": {n: method_statistics(runs, seeds, n) for n in ("ms", "triplet")},
            "runs": {str(s): r for s, r in runs.items()},
        },
    )


CONFIG = {
    "dataset": {"CompositeLocalizationDataset": {"image_size": 224, "source": "clipart"}},
    "test_dataset": {"CompositeLocalizationDataset": {"image_size": 256, "source": "clipart"}},
    "models": {"trunk": [{"mobilenet_v2_features": {}}, {"AdaptiveMaxPool2d": [1]}], "embedder": {"Linear": {
        "out_features": 128}}},
    "frozen_prefix": "0.13",
}  # fmt: skip


def test_tables_and_claims(loc):
    out = loc.assemble(_results(), CONFIG, 1, "quick")
    md = out["markdown"]
    for m in loc.METHODS:
        assert f"| {m} | signed |" in md and f"| {m} | ReLU |" in md  # Table I: both conventions
    assert "| Decomposition beats Grad-CAM (Table II) | Decomposition [signed] − Grad-CAM [ReLU]: +30.0" in md
    assert "MS − Triplet, test_p_at_1: +5.0 [+5.0, +5.0] | 0.002 | shown |" in md
    # the bias term does not help: Decomposition+Bias = 0 on every seed, Decomposition 40-60: -40, -50, -60 is far
    # below (t interval [-74.8, -25.2]) but its p 0.01307 is 0.065 after Holm over the ten claims -> inconclusive
    assert (
        "| the bias term does not help (Table II) | Decomposition+Bias [signed] − Decomposition [signed]: -50.0 "
        "[-74.8, -25.2] | 0.065 | inconclusive (3 seeds) |"
    ) in md
    # Table II: ReLU − signed of Decomposition is +5 (5, 0, 10)
    assert "| Decomposition | 50.0 ± 10.0 | 55.0 ± 13.2 | — | — | +5.0 [" in md
    assert "Setup: clipart composites, 3 test images of unseen classes at 256 px -> 8×8 maps" in md
    assert out["args"]["pool"] == "gmp" and out["args"]["dim"] == 128 and out["args"]["steps"] == 1
    assert set(out["analysis"]) == {"ms", "triplet", "ms_vs_triplet"}
    c = {c["metric"]: c for c in out["analysis"]["ms_vs_triplet"]["comparisons"]}["test_p_at_1"]
    assert c["differences"] == [-5.0, -5.0, -5.0]


def test_the_claims_are_one_holm_family_in_the_runners_words(loc):
    """Ten claims, δ = 5 points, 3 seeds (t_{0.975, 2} = 4.3027, p = 1 − t / √(t² + 2)); a constant difference has
    the t-test's p 0 (1 when it is 0) and the seed bootstrap's 2 / 10001 = 0.0002, one-signed ones keep that bootstrap
    p, so the larger p is the t-test's. Differences per claim, in the table's order: Decomposition [signed] − Grad-CAM
    30, 30, 30 (p 0.0002); − Grad-CAM (no norm) 40, 50, 60 (t 8.660, p 0.01307); Decomposition [ReLU] − Grad-CAM 35,
    30, 40 (t 12.12, p 0.00675); − Grad-CAM (no norm) 45, 50, 70 (t 7.201, p 0.01874); Grad-CAM (no norm) − Grad-CAM
    -10, -20, -30 (p 0.07418); Decomposition+Bias − Decomposition -40, -50, -60 (p 0.01307); MS − Triplet: training
    P@1 0, 0, 0 (p 1), unseen P@1 and both localisations 5, 5, 5 (p 0.0002). Holm: the four 0.0002 -> 10 · 0.0002 =
    0.0020; 6 · 0.00675 = 0.0405; 5 · 0.01307 = 0.0653 (and 4 ·, 3 · 0.01874 below it) -> 0.0653; 2 · 0.07418 =
    0.148; 1."""
    claims = loc.assemble(_results(), CONFIG, 1, "quick")["claims"]["comparisons"]
    holm = [0.0020, 0.0653, 0.0405, 0.0653, 0.148, 0.0653, 1.0, 0.0020, 0.0020, 0.0020]
    assert [c["p_holm"] for c in claims] == [pytest.approx(p, abs=1e-3) for p in holm]
    assert [c["smallest_effect"] for c in claims] == [5.0] * 10
    assert [c["verdict"] for c in claims] == [
        "shown",  # [30, 30], p̃ 0.002, 30 ≥ 5
        "inconclusive (3 seeds)",  # [25.2, 74.8] excludes 0, but p̃ 0.065 ≥ 0.05
        "shown",  # [22.6, 47.4], p̃ 0.040
        "inconclusive (3 seeds)",  # p̃ 0.065
        "inconclusive (3 seeds)",  # [-44.8, +4.8] contains 0
        "inconclusive (3 seeds)",  # on par: far below, p̃ 0.065
        "no effect of practical size",  # on par: [0, 0] within ±5
        "shown",
        "shown",
        "shown",
    ]
    out = loc.assemble(_results(), CONFIG, 1, "quick")
    assert loc.rerender(dict(out, claims=None, markdown="")) == out  # --from-json: the stored file gives the same
