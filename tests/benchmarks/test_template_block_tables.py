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
    fashion = _results(
        {
            "baseline": [80.0, 81.0, 82.0],
            "block": [82.0, 83.0, 84.5],  # +2, +2, +2.5: the interval lies above 0
            "aux_only": [79.0, 80.0, 83.0],
            "wider": [83.0, 84.0, 85.0],  # block − wider: -1, -1, -0.5: below 0
            "block_lambda0": [80.0, 82.0, 82.0],
        },
        [("block", "baseline"), ("aux_only", "baseline"), ("wider", "baseline"), ("block_lambda0", "baseline")],
    )
    ablation = _results(
        {"bn_relu_8": [70.0, 71.0, 72.0], "softmax_8": [69.0, 72.0, 71.0], "perturbed_8": [50.0, 52.0, 51.0]},
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
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert any("block improves the baseline" in r and r.endswith("| reproduced |") for r in rows)
    assert any("block − wider" in r and r.endswith("| contradicted |") for r in rows)
    assert any("λ 0.5 − 0:" in r for r in rows)
    assert any("perturbed/8 − bn_relu/8" in r and r.endswith("| contradicted |") for r in rows)  # on_par, far below
    assert any("softmax/8 − bn_relu/8" in r and r.endswith("| consistent |") for r in rows)
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
