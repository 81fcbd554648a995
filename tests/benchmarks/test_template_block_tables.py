"""The template-block benchmark's tables (benchmarks/template_block.py) on hand-made protocol results: Table 1 per data
set, the λ sweep, the soft-maximizer table and the claims in the runner's verdict vocabulary."""

import importlib.util
import os

import pytest

from pml_extensions.runner.outputs.results import summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def tb():
    spec = importlib.util.spec_from_file_location(
        "template_block", os.path.join(ROOT, "benchmarks", "template_block.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results(test, comparisons, extra=None):
    """Protocol-like results: per variant the test accuracy per seed, validation = test - 1, best iteration 100."""
    per_seed = {
        n: {s: {"test_accuracy": v[i], "val_accuracy": v[i] - 1, "best_iteration": 100.0} for i, s in enumerate(SEEDS)}
        for n, v in test.items()
    }
    history = [{"epoch": e, "iteration": 50 * e, "accuracy": 60.0 + 10 * e} for e in (1, 2)]
    units = {n: {str(s): {"history": history, "train_seconds": 30.0} for s in SEEDS} for n in test}
    return summarize(
        per_seed,
        comparisons,
        metrics=["test_accuracy"],
        extra={
            "seeds": list(SEEDS),
            "device": "cpu",
            "num_epochs": 2,
            "iterations_per_epoch": 50,
            "batch_size": 32,
            "sizes": {"train": 30, "val": 10, "test": 10},
            "num_classes": 10,
            "params": {n: 1000 + 10 * i for i, n in enumerate(test)},
            "aux_weight": {n: (0.0 if n == "block_lambda0" else 0.5) if n.startswith("block") else None for n in test},
            "units": units,
            "train_seconds_sum": 90.0 * len(test),
            **(extra or {}),
        },
    )


CONFIG = {"models": {"trunk": {"SmallResNet": {"widths": [8, 16, 32, 32], "blocks": 1}}}}


def test_table1_lambda_sweep_ablation_and_claims(tb):
    """Six claims, δ = 0.5 points, 3 seeds (t_{0.975, 2} = 4.3027; two-sided p = 1 − t / √(t² + 2)); every
    difference of one sign keeps the seed bootstrap's p at 2 / 10001, so the t-test's p is the larger:

    - block − baseline 2, 2, 2.5: mean 2.167, sd 0.289, t = 13.0, p = 0.00587, interval [1.450, 2.884];
    - block − wider -2, -2, -1.5: t = -11.0, p = 0.00816, interval [-2.551, -1.116];
    - block − aux_only 3, 3, 1.5: mean 2.5, sd 0.866, t = 5.0, p = 0.0377, interval [0.349, 4.651];
    - λ 0.5 − 0 (block − block_lambda0) 2, 1, 2.5: t = 4.158, p = 0.0533, interval [-0.064, 3.731];
    - perturbed/8 − bn_relu/8 (on par) -20, -19, -21: t = -34.64, p = 0.00083, interval [-22.48, -17.52];
    - softmax/8 − bn_relu/8 (on par) 0, 0.2, 0.1: t = 1.732, p = 0.225, interval [-0.148, 0.348].

    Holm over the six: 0.00083 · 6 = 0.0050, 0.00587 · 5 = 0.0293, 0.00816 · 4 = 0.0327, 0.0377 · 3 = 0.113,
    max(0.0533 · 2, 0.113) = 0.113, 0.225."""
    fashion = _results(
        {
            "baseline": [80.0, 81.0, 82.0],
            "block": [82.0, 83.0, 84.5],
            "aux_only": [79.0, 80.0, 83.0],
            "wider": [84.0, 85.0, 86.0],
            "block_lambda0": [80.0, 82.0, 82.0],
        },
        [("block", "baseline"), ("aux_only", "baseline"), ("wider", "baseline"), ("block_lambda0", "baseline")],
    )
    ablation = _results(
        {"bn_relu_8": [70.0, 71.0, 72.0], "softmax_8": [70.0, 71.2, 72.1], "perturbed_8": [50.0, 52.0, 51.0]},
        [("softmax_8", "bn_relu_8"), ("perturbed_8", "bn_relu_8")],
        extra={"soft_maximizer": {"softmax_8": {"mu": -0.2, "eta": 7.0, "mu_per_model": [], "eta_per_model": []}}},
    )
    soft_config = dict(CONFIG, variants={"perturbed_8": {"soft_maximizer": {"mixing": "perturbed", "num_samples": 8}}})
    out = tb.assemble(
        {"fashion_lambda": (fashion, CONFIG, 1, "f"), "ablation": (ablation, soft_config, 1, "a")}, "medium"
    )
    md = out["markdown"]
    assert "| + template-matching block (λ = 0.5) | 1,010 | 83.17 ± 1.26 | +2.17 [+1.45, +2.88] | 3/3 | 100 |" in md
    assert "100 iterations × batch 32" in md and "widths [8, 16, 32, 32]" in md
    assert "| block improves the baseline (Table 1) | Fashion-MNIST | block − baseline: +2.17 [" in md
    claims = out["claims"]["comparisons"]
    assert [(c["variant"], c["baseline"], c["claim"]) for c in claims] == [
        ("block", "baseline", "greater"),
        ("block", "wider", "greater"),
        ("block", "aux_only", "greater"),
        ("λ 0.5", "0", "greater"),
        ("softmax/8", "bn_relu/8", "on_par"),
        ("perturbed/8", "bn_relu/8", "on_par"),
    ]
    holm = [0.0293, 0.0327, 0.113, 0.113, 0.225, 0.0050]
    assert [c["p_holm"] for c in claims] == [pytest.approx(p, abs=1e-3) for p in holm]
    assert [c["verdict"] for c in claims] == [
        "shown",  # 1.450 > 0, p̃ 0.029 < 0.05, 2.17 ≥ 0.5
        "contradicted",  # -1.116 < 0, p̃ 0.033, -1.83 ≤ -0.5
        "inconclusive (3 seeds)",  # excludes 0, but p̃ 0.113 ≥ 0.05 and the interval reaches past ±0.5
        "inconclusive (3 seeds)",  # contains 0 and reaches past 0.5
        "no effect of practical size",  # on par: within ±0.5
        "contradicted",  # on par, 20 points below with p̃ 0.005
    ]
    assert claims[0]["ci95"] == pytest.approx([2.1667 - 0.7171, 2.1667 + 0.7171], abs=1e-3)
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert any("block improves the baseline" in r and r.endswith("| 0.029 | shown |") for r in rows)
    assert any("block − wider" in r and r.endswith("| 0.033 | contradicted |") for r in rows)
    assert any("λ 0.5 − 0:" in r and r.endswith("| inconclusive (3 seeds) |") for r in rows)
    assert any("perturbed/8 − bn_relu/8" in r and r.endswith("| contradicted |") for r in rows)
    assert any("softmax/8 − bn_relu/8" in r and r.endswith("| no effect of practical size |") for r in rows)
    assert "δ = 0.5 points" in md and "Holm-adjusted over the 6 claims" in md
    assert tb.rerender(dict(out, claims=None, markdown="")) == out  # --from-json: the stored file gives the same
    assert "| 0 | 81.33 ± 1.15 | +0.33 [" in md and "| 0.5 | 83.17 ± 1.26 | +2.17 [" in md  # the λ sweep
    assert "μ = -0.20, η = 7.00" in md and "S = 8 samples" in md
    assert "fashion_lambda 7.5, ablation 4.5." in md  # training minutes per experiment (sums over the units)
    assert out["lambda_sweep"]["variants"].keys() == {"λ=0.5", "λ=0"}
    assert out["ablation"]["variants"].keys() == {"bn_relu/8", "softmax/8", "perturbed/8"}
    c = out["fashion"]["comparisons"][0]
    assert (c["variant"], c["wins"], c["std_difference"]) == ("block", 3, c["std"])
    assert out["fashion"]["mean_val_curve"]["baseline"] == [70.0, 80.0] and out["fashion"]["curve_iterations"] == [
        50,
        100,
    ]
