"""The localisation benchmark's tables on a hand-made set of runs: both conventions per method, paired CIs."""

import argparse
import importlib.util
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def loc():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("localization", os.path.join(ROOT, "benchmarks", "localization.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs(loc):
    # best accuracies per seed: Decomposition signed 40/50/60, ReLU 45/50/70; Grad-CAM ReLU 10/20/30; others 0
    base = {
        "Decomposition [signed]": [40, 50, 60],
        "Decomposition [ReLU]": [45, 50, 70],
        "Grad-CAM [ReLU]": [10, 20, 30],
    }
    runs = {}
    for i, s in enumerate((0, 1, 2)):
        losses = {}
        for loss, shift in (("ms", 0.0), ("triplet", -5.0)):
            scores = {}
            for m in loc.METHODS + (loc.DEMO,):
                for conv in loc.CONVENTIONS:
                    if m == loc.DEMO and conv == "ReLU":
                        continue
                    k = f"{m} [{conv}]"
                    acc = base.get(k, [0, 0, 0])[i] + shift
                    scores[k] = {"best_accuracy": acc, "best_threshold": 0.5, "accuracy": [acc] * 19}
            losses[loss] = {
                "scores": scores,
                "identity_rgradcam_vs_relu_decomposition_bias": {
                    "n_pairs": 2,
                    "max_rel_diff_relu": 0.0,
                    "same_hits_every_threshold": True,
                },
                "train_p_at_1": 90.0 + i,
                "test_p_at_1": 50.0 + i + shift,
            }
        runs[s] = {
            "losses": losses,
            "centre_box": {"best_accuracy": 5.0},
            "thresholds": [0.05 * k for k in range(1, 20)],
            "feature_size": [8, 8],
        }
    return runs


def test_analysis_pairs_methods_conventions_and_losses(loc):
    runs = _runs(loc)
    res = loc.analyse(runs, (0, 1, 2), ["ms", "triplet"])
    comps = {(c["variant"], c["baseline"]): c for c in res["ms"]["comparisons"]}
    c = comps[("Decomposition [ReLU]", "Decomposition [signed]")]  # differences 5, 0, 10
    assert c["differences"] == [5.0, 0.0, 10.0] and c["mean_difference"] == 5.0
    half = 4.302652729911275 * 5.0 / math.sqrt(3.0)
    assert c["ci95"] == pytest.approx([5.0 - half, 5.0 + half])
    c = comps[("Grad-CAM [ReLU]", "Decomposition [ReLU]")]  # -35, -30, -40
    assert c["mean_difference"] == -35.0
    mt = {c["metric"]: c for c in res["ms_vs_triplet"]["comparisons"]}
    assert mt["test_p_at_1"]["differences"] == [-5.0, -5.0, -5.0]
    assert mt["train_p_at_1"]["mean_difference"] == 0.0
    out = {"analysis": res, "runs": runs, "size": "quick", "device": "cpu", "seconds": 60.0}
    args = argparse.Namespace(source="clipart", n_test=3, size=256, pool="gmp", dim=128, steps=1, n_train=3)
    md = loc.markdown(out, args, (0, 1, 2), ["ms", "triplet"])
    for m in loc.METHODS:
        assert f"| {m} | signed |" in md and f"| {m} | ReLU |" in md  # Table I: both conventions
    assert "| Decomposition beats Grad-CAM (Table II) | Decomposition [signed] − Grad-CAM [ReLU]: +30.0" in md
    assert "MS − Triplet, test_p_at_1: +5.0 [+5.0, +5.0] | reproduces |" in md


def test_merge_of_per_seed_parts(loc, tmp_path):
    import json

    runs = _runs(loc)
    args = dict(
        source="clipart",
        n_test=3,
        size=256,
        pool="gmp",
        dim=128,
        steps=1,
        n_train=3,
        losses=["ms", "triplet"],
    )
    paths = []
    for s in (0, 1, 2):
        part = {
            "size": "quick",
            "device": "cpu",
            "seeds": [s],
            "runs": {str(s): runs[s]},
            "seconds": 10.0 + s,
            "args": dict(args, seeds=[s], tag=f"part_s{s}"),
        }
        paths.append(str(tmp_path / f"p{s}.json"))
        with open(paths[-1], "w") as f:
            json.dump(part, f)
    out = loc.merge_parts(paths, str(tmp_path))
    assert out["seeds"] == [0, 1, 2] and out["seconds"] == 12.0
    whole = loc.analyse(runs, (0, 1, 2), ["ms", "triplet"])
    assert out["analysis"]["ms"]["comparisons"] == whole["ms"]["comparisons"]
    assert (tmp_path / "localization.md").read_text() == out["markdown"]
    with pytest.raises(ValueError, match="seed 0 is in two parts"):
        loc.merge_parts([paths[0], paths[0]], str(tmp_path))
    with open(paths[1]) as f:
        other = json.load(f)
    other["args"]["steps"] = 5
    with open(paths[1], "w") as f:
        json.dump(other, f)
    with pytest.raises(ValueError, match="other arguments"):
        loc.merge_parts(paths, str(tmp_path))
