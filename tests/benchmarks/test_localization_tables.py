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
    assert "MS − Triplet, test_p_at_1: +5.0 [+5.0, +5.0] | reproduced |" in md
    # the bias term does not help: Decomposition+Bias = 0 on every seed, Decomposition 40-60 -> on_par contradicted
    assert "| the bias term does not help (Table II) | Decomposition+Bias [signed] − Decomposition [signed]" in md
    assert "| contradicted |" in md
    # Table II: ReLU − signed of Decomposition is +5 (5, 0, 10)
    assert "| Decomposition | 50.0 ± 10.0 | 55.0 ± 13.2 | — | — | +5.0 [" in md
    assert "Setup: clipart composites, 3 test images of unseen classes at 256 px -> 8×8 maps" in md
    assert out["args"]["pool"] == "gmp" and out["args"]["dim"] == 128 and out["args"]["steps"] == 1
    assert set(out["analysis"]) == {"ms", "triplet", "ms_vs_triplet"}
    c = {c["metric"]: c for c in out["analysis"]["ms_vs_triplet"]["comparisons"]}["test_p_at_1"]
    assert c["differences"] == [-5.0, -5.0, -5.0]
