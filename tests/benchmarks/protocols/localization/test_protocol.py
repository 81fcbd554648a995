"""benchmarks/protocols/localization/protocol.py: the paired statistics on hand-made units (both conventions per method,
MS vs Triplet), the settings' one-line errors, and (slow) a tiny whole run that resumes after an interruption to the
numbers of an uninterrupted one."""

import math
import os

import pytest

from benchmarks.protocols import config_path
from benchmarks.protocols.localization import Localization, method_statistics, variant_statistics
from benchmarks.protocols.localization.protocol import with_kwargs
from pml_extensions.runner.errors import ConfigError

from .loc_testing import hand_units

QUIET = dict(log=lambda *a, **k: None)


def test_methods_are_paired_within_a_conventions_and_losses_across_seeds():
    units, runs = hand_units()
    res = method_statistics(runs, [0, 1, 2], "ms")
    comps = {(c["variant"], c["baseline"]): c for c in res["comparisons"]}
    c = comps[("Decomposition [ReLU]", "Decomposition [signed]")]  # differences 5, 0, 10
    assert c["differences"] == [5.0, 0.0, 10.0] and c["mean_difference"] == 5.0
    half = 4.302652729911275 * 5.0 / math.sqrt(3.0)
    assert c["ci95"] == pytest.approx([5.0 - half, 5.0 + half])
    c = comps[("Grad-CAM [ReLU]", "Decomposition [ReLU]")]  # -35, -30, -40
    assert c["mean_difference"] == -35.0
    assert ("Decomposition (demo ReLU-then-sum) [signed]", "Decomposition [signed]") in comps
    assert res["variants"]["centre box"]["mean"]["held_out_accuracy"] == 5.0
    mt = {c["metric"]: c for c in variant_statistics(units, [0, 1, 2], [("triplet", "ms")])["comparisons"]}
    assert mt["test_p_at_1"]["differences"] == [-5.0, -5.0, -5.0]
    assert mt["train_p_at_1"]["mean_difference"] == 0.0
    assert mt["Decomposition [signed]"]["mean_difference"] == -5.0


def _config(**changes):
    base = {
        "dataset": {"CompositeLocalizationDataset": {}},
        "test_dataset": {"CompositeLocalizationDataset": {}},
        "validation_dataset": {"CompositeLocalizationDataset": {}},
        "models": {"trunk": [{"Flatten": None}]},
        "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}},
        "optimizers": {},
        "num_epochs": 1,
        "iterations_per_epoch": 2,
        "variants": {"ms": {}, "triplet": {}},
    }
    base.update(changes)
    return base


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"seeds": [0, 0]}, r"^g.yaml: seeds: expected distinct seeds"),
        ({"comparisons": [["ms", "nope"]]}, r"^g.yaml: comparisons: \['ms', 'nope'\] names an unknown variant"),
        ({"comparisons": [["ms"]]}, r"^g.yaml: comparisons: expected a list of \[variant, baseline\] pairs"),
        (
            {"variants": {"ms": {}, "t": {"dataset_seed": {"train": 5}}}},
            r"\(variants.t\): dataset_seed must be the same",
        ),
        ({"iterations_per_epoch": 0}, r"iterations_per_epoch: expected an integer >= 1, got 0"),
        ({"test_dataset": None}, r"missing key 'test_dataset'"),
        ({"dataset_seed": {"val": 3}}, r"dataset_seed: expected \{train: 1000, test: 2000, validation: 3000\}"),
        ({"validation_dataset": None}, r"missing key 'validation_dataset'"),
    ],
)
def test_settings_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        Localization.check(_config(**changes), {"seeds": "g.yaml", "variants": "g.yaml", "comparisons": "g.yaml"})


def tiny(tmp_path):
    from pml_extensions.runner.protocols import load_config

    config, sources = load_config(config_path("localization"))
    config.update(seeds=[0], num_epochs=2, iterations_per_epoch=2, batch_size=8, eval_batch_size=4, device="cpu")
    config["dataset"]["CompositeLocalizationDataset"].update(n_images=16, image_size=96)
    config["test_dataset"]["CompositeLocalizationDataset"].update(n_images=3, image_size=96)
    config["validation_dataset"]["CompositeLocalizationDataset"].update(n_images=2, image_size=96)
    return config, sources


@pytest.mark.slow
def test_tiny_run_resumes_to_the_uninterrupted_numbers(tmp_path, monkeypatch, mobilenet_weights):
    from pml_extensions.runner.experiment import checkpoint
    from pml_extensions.runner.protocols import run_protocol
    from pml_extensions.runner.protocols.reproduce import numeric_differences

    config, sources = tiny(tmp_path)
    clean = run_protocol(config, str(tmp_path / "clean"), sources, **QUIET)
    assert list(clean["variants"]) == ["ms", "triplet"]
    unit = clean["runs"]["0"]["losses"]["triplet"]
    assert set(unit["scores"]) >= {"Decomposition [signed]", "Grad-CAM (no norm) [ReLU]"}
    assert unit["feature_size"] == [3, 3] and clean["runs"]["0"]["image_size"] == [96, 96]
    assert {c["metric"] for c in clean["comparisons"]} >= {"train_p_at_1", "Decomposition+Bias [ReLU]"}
    assert set(clean["methods"]) == {"ms", "triplet"}
    real, stopped = checkpoint.Checkpointer.commit, []

    def commit(self, state):  # the triplet unit "dies" right after committing its first epoch
        real(self, state)
        if state["epoch"] == 1 and os.sep + "triplet" + os.sep in self.folder and not stopped:
            stopped.append(1)
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.Checkpointer, "commit", commit)
    folder = str(tmp_path / "killed")
    with pytest.raises(KeyboardInterrupt):
        Localization(config, folder, sources, **QUIET).run_units(seeds=[0])
    monkeypatch.undo()
    resumed = run_protocol(config, folder, sources, **QUIET)
    assert numeric_differences(clean, resumed) == []


def test_unknown_seed_of_a_part_is_named(tmp_path):
    from pml_extensions.runner.protocols import load_config

    config, sources = load_config(config_path("localization"))
    with pytest.raises(ConfigError, match=r"\[7\] are not variants / seeds of this config"):
        Localization(config, str(tmp_path / "x"), sources, **QUIET).run_units(seeds=[7])


def test_every_method_is_paired_with_the_centre_box_at_the_held_out_choice():
    """Hand units: the centre box scores 5 at its held-out side (7.5 at the test-picked side) every seed; Decomposition
    [signed] 40, 50, 60 at its held-out threshold (42.5, 52.5, 62.5 test-picked): differences 35, 45, 55 (t interval 45
    ± 4.3027 · 10 / √3 = 45 ± 24.84), the same under the test-picked metric (both move by 2.5)."""
    _, runs = hand_units()
    res = method_statistics(runs, [0, 1, 2], "ms")
    held = {(c["variant"], c["baseline"]): c for c in res["comparisons"] if c["metric"] == "held_out_accuracy"}
    c = held[("Decomposition [signed]", "centre box")]
    assert c["differences"] == [35.0, 45.0, 55.0]
    assert c["ci95"] == pytest.approx([45.0 - 4.302652729911275 * 10.0 / math.sqrt(3.0), 45.0 + 24.8414], abs=1e-3)
    assert held[("Grad-CAM [ReLU]", "centre box")]["differences"] == [5.0, 15.0, 25.0]
    methods = [k for k in res["variants"] if k != "centre box"]
    assert {k for k in held if k[1] == "centre box"} == {(k, "centre box") for k in methods}
    v = res["variants"]
    assert v["centre box"]["mean"] == {"held_out_accuracy": 5.0, "best_accuracy": 7.5}
    assert v["Decomposition [signed]"]["mean"] == {"held_out_accuracy": 50.0, "best_accuracy": 52.5}


def test_with_kwargs_copies_the_spec():
    spec = {"mobilenet_v2_features": {"pretrained": True}}
    assert with_kwargs(spec, pretrained=False) == {"mobilenet_v2_features": {"pretrained": False}}
    assert spec == {"mobilenet_v2_features": {"pretrained": True}}
