"""benchmarks/protocols/template_block/protocol.py: tiny whole runs (slow) — the results layout, an interrupted run that
resumes to the numbers of an uninterrupted one, ``--reproduce``, the soft-maximizer chain and the metric-learning
task; and one-line errors."""

import json
import os

import pytest

from benchmarks.protocols.template_block import TemplateBlock, load_models
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import run_protocol
from pml_extensions.runner.protocols.reproduce import numeric_differences, reproduce

from .tb_testing import tiny_config

QUIET = dict(log=lambda *a, **k: None)


@pytest.mark.slow
def test_table1_run_layout_and_pairing(tmp_path):
    config, sources = tiny_config()
    r = run_protocol(config, str(tmp_path / "exp"), sources, **QUIET)
    assert list(r["variants"]) == ["baseline", "block", "aux_only", "wider"]
    assert set(r["variants"]["block"]["per_seed"]["1"]) == {"test_accuracy", "val_accuracy", "best_iteration"}
    assert [(c["variant"], c["baseline"], c["metric"]) for c in r["comparisons"]][:2] == [
        ("block", "baseline", "test_accuracy"),
        ("aux_only", "baseline", "test_accuracy"),
    ]
    assert r["sizes"] == {"train": 60, "val": 20, "test": 20} and r["num_classes"] == 10
    assert r["params"]["wider"] >= r["params"]["block"] > r["params"]["aux_only"] > r["params"]["baseline"]
    assert r["match_parameters"]["wider"]["target_parameters"] == r["params"]["block"]
    assert r["aux_weight"] == {"baseline": None, "block": 0.5, "aux_only": 0.5, "wider": None}
    unit = r["units"]["block"]["0"]
    assert [h["iteration"] for h in unit["history"]] == [3, 6] and unit["best_epoch"] in (1, 2)
    folder = tmp_path / "exp"
    for name in ("results.json", "results.md", "report.html", "config.yaml", "block/seed_1/best_models.pth"):
        assert (folder / name).exists(), name
    md = (folder / "results.md").read_text()
    assert "| block − baseline | test_accuracy |" in md and "Parameters (every model): baseline" in md
    models, views = load_models(str(folder), "block", seed=1)
    assert views["num_classes"] == 10 and type(models["trunk"].layer3[-1]).__name__ == "TemplateMatchingBlock"
    with pytest.raises(ConfigError, match="variant 'nope' not in"):
        load_models(str(folder), "nope")


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch):
    from pml_extensions.runner.experiment import checkpoint

    config, sources = tiny_config(variants=("baseline", "block"), seeds=(0,))
    clean = run_protocol(config, str(tmp_path / "clean"), sources, **QUIET)
    real, stopped = checkpoint.Checkpointer.commit, []

    def commit(self, state):  # the block unit "dies" right after committing its first epoch
        real(self, state)
        if state["epoch"] == 1 and os.sep + "block" + os.sep in self.folder and not stopped:
            stopped.append(state["epoch"])
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.Checkpointer, "commit", commit)
    folder = str(tmp_path / "killed")
    with pytest.raises(KeyboardInterrupt):
        run_protocol(config, folder, sources, **QUIET)
    assert stopped == [1] and not os.path.exists(os.path.join(folder, "block", "seed_0", "result.json"))
    resumed = run_protocol(config, folder, sources, **QUIET)  # resumes the block unit at epoch 2
    assert numeric_differences(clean, resumed) == []
    # --reproduce: the finished run again from its config.yaml, every number equal
    outcome = reproduce(str(tmp_path / "clean"), str(tmp_path / "again"), log=lambda *a, **k: None)
    assert outcome["equal"], outcome["differences"]


@pytest.mark.slow
def test_soft_maximizers_estimate_from_the_trained_bn_relu_models(tmp_path):
    config, sources = tiny_config(variants=("bn_relu_8", "softmax_8"), name="template_block_soft_maximizers")
    config["variants"]["softmax_8"]["soft_maximizer"].update(probe_images=16, probe_batch_size=8)
    folder = str(tmp_path / "exp")
    # a part with the soft-maximizer variant alone trains the BN-ReLU models it estimates from first (every seed)
    units = TemplateBlock(config, folder, sources, **QUIET).run_units(variants=["softmax_8"])
    assert list(units) == ["softmax_8"] and sorted(units["softmax_8"]) == [0, 1]
    for seed in (0, 1):
        assert os.path.exists(os.path.join(folder, "bn_relu_8", f"seed_{seed}", "result.json"))
    r = run_protocol(config, folder, sources, **QUIET)  # finds every unit finished
    soft = r["soft_maximizer"]["softmax_8"]
    assert len(soft["mu_per_model"]) == 2 and soft["mu"] == pytest.approx(sum(soft["mu_per_model"]) / 2)
    assert r["params"]["softmax_8"] < r["params"]["bn_relu_8"]  # the swapped BNs had parameters, the maximizers none
    assert [c["variant"] for c in r["comparisons"]] == ["softmax_8"]


@pytest.mark.slow
def test_metric_learning_task(tmp_path):
    config, sources = tiny_config(variants=("baseline", "block"), seeds=(0,))
    config.update(
        task="metric_learning",
        dataset={"FashionMNIST": {"class_disjoint": True, "max_per_class": 8}},
        test_dataset=None,
        split=None,
        validation={"class_fraction": 0.4, "seed": 0},
        models={"trunk": {"SmallResNet": {"in_channels": 1, "widths": [4, 4, 8, 8]}}, "embedder": {"Linear": {
            "in_features": 8, "out_features": 6}}},
        loss_funcs={"metric_loss": {"ContrastiveLoss": {}}},
        sampler={"MPerClassSampler": {"m": 4}},
        optimizers={"trunk_optimizer": {"Adam": {"lr": 0.001}}, "embedder_optimizer": {"Adam": {"lr": 0.001}}},
        lr_schedulers=None,
        tester={"GlobalEmbeddingSpaceTester": {"batch_size": 16, "dataloader_num_workers": 0}},
        accuracy_calculator={"AccuracyCalculator": {"include": ["mean_average_precision_at_r", "precision_at_1",
            "r_precision"], "k": "max_bin_count"}},
    )  # fmt: skip
    r = run_protocol(config, str(tmp_path / "exp"), sources, **QUIET)
    row = r["variants"]["block"]["per_seed"]["0"]
    assert set(row) == {
        "test_mean_average_precision_at_r",
        "test_precision_at_1",
        "test_r_precision",
        "val_mean_average_precision_at_r",
        "best_iteration",
    }
    assert r["sizes"] == {"train": 24, "val": 16, "test": 40} and r["primary_metric"] == "mean_average_precision_at_r"
    assert r["comparisons"][0]["metric"] == "test_mean_average_precision_at_r"
    with open(tmp_path / "exp" / "results.json") as f:
        assert json.load(f)["task"] == "metric_learning"


def test_unknown_variant_or_seed_in_a_part_is_named(tmp_path):
    config, sources = tiny_config(variants=("baseline",), seeds=(0,))
    with pytest.raises(ConfigError, match=r"\['nope', 5\] are not variants / seeds of this config"):
        TemplateBlock(config, str(tmp_path / "x"), sources, **QUIET).run_units(variants=["nope"], seeds=[5])
