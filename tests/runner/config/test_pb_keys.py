"""Every PB v0.9.33 key: honoured (its effect) or refused (its one-line message) — runner/config/pb_keys.py."""

import json
import os

import numpy as np
import pytest
import torch

from pml_extensions.runner.config import pb_keys
from pml_extensions.runner.errors import ConfigError


def _tester_cfg(**kwargs):
    return {"tester": {"GlobalEmbeddingSpaceTester": kwargs}}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reference_set": "compared_to_training_set"}, "reference_set: only compared_to_self"),
        ({"visualizer": {"UMAP": {}}}, "visualizer: embedding plots are not supported"),
        ({"batch_sise": 3}, "unknown argument 'batch_sise'; did you mean batch_size"),
        ({"pca": 0}, "pca: expected null or a positive"),
        ({"accuracy_calculator": {"NoSuchCalculator": {}}}, "unknown class 'NoSuchCalculator'"),
        (
            {"accuracy_calculator": {"AccuracyCalculator": {"include": ["precision_at_one"]}}},
            "unknown metric 'precision_at_one'; did you mean precision_at_1",
        ),
        # the calculator's spec has one reader (specs.one_spec): its arguments as a list were a TypeError traceback
        (
            {"accuracy_calculator": {"AccuracyCalculator": [1, 2]}},
            "accuracy_calculator.AccuracyCalculator: expected keyword arguments",
        ),
        ({"accuracy_calculator": [1]}, r"accuracy_calculator: expected \{ClassName: \{kwargs\}\}, got \[1\]"),
    ],
)
def test_tester_refusals(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        pb_keys.check_values(_tester_cfg(**kwargs), {"tester": "config_eval/default.yaml"})


def test_split_manager_is_honoured_and_checked():
    s = pb_keys.split_settings(
        {
            "split_manager": {
                "ClassDisjointSplitManager": {
                    "test_size": 0.25,
                    "test_start_idx": 0.0,
                    "num_training_partitions": 3,
                    "num_training_sets": 2,
                    "hierarchy_level": 1,
                    "data_and_label_getter_keys": ["image", "label"],
                }
            }
        }
    )
    assert s == {
        "test_size": 0.25,
        "test_start_idx": 0.0,
        "num_training_partitions": 3,
        "num_training_sets": 2,
        "hierarchy_level": 1,
        "data_and_label_getter_keys": ["image", "label"],
        "test_classes": None,
    }
    assert pb_keys.split_settings({})["num_training_partitions"] == 4
    getter = pb_keys.data_and_label_getter(s["data_and_label_getter_keys"])
    assert getter({"image": "x", "label": 3}) == ("x", 3)
    assert pb_keys.label_level(np.array([[0, 10], [1, 11]]), 1).tolist() == [10, 11]
    with pytest.raises(ConfigError, match="level 1 does not exist; the dataset's labels have 1 level"):
        pb_keys.label_level(np.array([0, 1]), 1)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"ClosedSetSplitManager": {}}, "ClosedSetSplitManager is powerful-benchmarker's, not implemented here"),
        ({"ClassDisjointSplitManager": {"test_sizes": 0.5}}, "unknown argument 'test_sizes'; did you mean test_size"),
        ({"ClassDisjointSplitManager": {"test_size": 1.5}}, "test_size: expected a fraction"),
        ({"ClassDisjointSplitManager": {"num_training_sets": 5}}, "num_training_sets: 5 is more than"),
        ({"ClassDisjointSplitManager": {"data_and_label_getter_keys": "data"}}, "data_and_label_getter_keys: expected"),
    ],
)
def test_split_manager_refusals(spec, message):
    with pytest.raises(ConfigError, match=message):
        pb_keys.split_settings({"split_manager": spec})


def test_splits_to_eval():
    assert pb_keys.splits_to_eval({"splits_to_eval": ["train", "val"]}) == ["train", "val"]
    with pytest.raises(ConfigError, match="splits_to_eval: expected a list of train/val"):
        pb_keys.splits_to_eval({"splits_to_eval": ["test"]})


def test_hook_container_primary_metric_and_refusals():
    cfg = {"hook_container": {"HookContainer": {"primary_metric": "precision_at_1"}}}
    assert pb_keys.primary_metric(cfg) == "precision_at_1"
    assert pb_keys.primary_metric({}) == "mean_average_precision_at_r"
    for kwargs, message in [
        ({"save_models": False}, "save_models: must be true"),
        ({"validation_split_name": "dev"}, "validation_split_name"),
        ({"primary_metrics": "x"}, "did you mean primary_metric"),
    ]:
        with pytest.raises(ConfigError, match=message):
            pb_keys.hook_settings({"hook_container": {"HookContainer": kwargs}})


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("api_parser", {"BaseAPIParser": {}}, "API parsers are PB's internals"),
        ("skip_eval_if_already_done", False, "never evaluates a logged epoch again"),
        ("save_figures_on_tensorboard", True, "figures go to report.html"),
        ("override_required_compatible_factories", True, "custom factories are not supported"),
        ("save_lists_in_db", "yes", "expected true or false"),
        ("log_data_to_tensorboard", True, "needs the tensorboard package"),
    ],
)
def test_general_flag_refusals(key, value, message):
    pytest.importorskip("yaml")
    if key == "log_data_to_tensorboard":
        try:
            import tensorboard  # noqa: F401

            pytest.skip("tensorboard installed: the flag is honoured")
        except ImportError:
            pass
    with pytest.raises(ConfigError, match=message) as e:
        pb_keys.check_values({key: value}, {key: "config_general/default.yaml"})
    assert str(e.value).startswith(f"config_general/default.yaml: {key}")


def test_general_flags_honoured(tmp_path):
    cfg = {"save_lists_in_db": True, "skip_ensemble_eval_if_already_done": True}
    pb_keys.check_values(cfg)
    assert pb_keys.record_keeper_options(cfg, str(tmp_path)) == {"save_lists": True, "tensorboard_writer": None}
    assert pb_keys.reuse_test_results(cfg, str(tmp_path)) is None
    (tmp_path / "results.json").write_text(json.dumps({"test": {"separate_2D": {"precision_at_1": 0.5}}}))
    assert pb_keys.reuse_test_results(cfg, str(tmp_path)) == {"separate_2D": {"precision_at_1": 0.5}}
    assert pb_keys.reuse_test_results({"skip_ensemble_eval_if_already_done": False}, str(tmp_path)) is None


def test_two_classes_after_a_merge_are_an_error():
    with pytest.raises(ConfigError, match=r"optimizers.trunk_optimizer: 2 classes \(RMSprop, Adam\).*~OVERRIDE~"):
        pb_keys.check_values({"optimizers": {"trunk_optimizer": {"RMSprop": {}, "Adam": {}}}})


def test_keys_take_effect_in_an_mlrc_run(tmp_path):
    """PB v0.9.33 keys through the protocol: primary_metric selects, include limits the metrics, splits_to_eval
    adds a train table, num_training_sets limits the folds, the aggregator averages them."""
    import os

    from pml_extensions.runner.protocols import load_config, run_protocol
    from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

    register_tiny()
    root = write_tiny_config(
        str(tmp_path / "cfg"),
        {
            "config_eval/default.yaml": """
tester:
  GlobalEmbeddingSpaceTester:
    batch_size: 64
    dataloader_num_workers: 0
    accuracy_calculator: {AccuracyCalculator: {include: [precision_at_1], k: 1}}
hook_container: {HookContainer: {primary_metric: precision_at_1}}
aggregator: {MeanAggregator: {split_to_aggregate: val}}
ensemble: {ConcatenateEmbeddings: {normalize_embeddings: True, use_trunk_output: False}}
""",
            "config_dataset/default.yaml": """
dataset: {TinyVectors: {num_classes: 16, per_class: 8}}
splits_to_eval: [train, val]
split_manager: {ClassDisjointSplitManager: {num_training_partitions: 4, num_training_sets: 2}}
""",
        },
    )
    cfg, sources = load_config(root, None, {"num_epochs_train": 1})
    results = run_protocol(cfg, str(tmp_path / "exp"), sources, log=lambda *a: None)
    assert results["primary_metric"] == "precision_at_1" and len(results["folds"]) == 2
    assert all("best_val_precision_at_1" in f for f in results["folds"])
    for key, metrics in results["test"].items():
        if key != "per_model":
            assert set(metrics) == {"precision_at_1"}
    best = [f["best_val_precision_at_1"] for f in results["folds"]]
    assert results["aggregate"]["precision_at_1"] == pytest.approx(sum(best) / 2, abs=1e-12)
    logs = " ".join(os.listdir(tmp_path / "exp" / "fold_0" / "logs"))
    assert "accuracies_train" in logs and "accuracies_val" in logs


def test_getter_keys_on_tuple_datasets_say_what_to_do():
    with pytest.raises(
        ConfigError, match=r"names dict keys, but the dataset returns \(image, label\) tuples; set it to null"
    ):
        pb_keys.data_and_label_getter(["data", "label"])(("img", 1))
    assert pb_keys.data_and_label_getter(None)(("img", 1)) == ("img", 1)
    assert pb_keys.data_and_label_getter([1, 0])(("img", 1)) == (1, "img")


PB_0933 = {  # PB v0.9.33's config keys with its documented defaults (dataset, trunk and sizes overridden)
    "config_general/default.yaml": """
trainer: {MetricLossOnly: {iterations_per_epoch: 2, dataloader_num_workers: 0, batch_size: 8,
          freeze_trunk_batchnorm: True, label_hierarchy_level: 0, loss_weights: null, set_min_label_to_zero: True}}
num_epochs_train: 1
save_interval: 2
patience: 9
check_untrained_accuracy: True
skip_eval_if_already_done: True
skip_ensemble_eval_if_already_done: True
save_figures_on_tensorboard: False
save_lists_in_db: False
override_required_compatible_factories: False
api_parser: null
""",
    "config_eval/default.yaml": """
tester: {GlobalEmbeddingSpaceTester: {reference_set: compared_to_self, normalize_embeddings: True,
         use_trunk_output: False, batch_size: 32, dataloader_num_workers: 0, pca: null,
         accuracy_calculator: {AccuracyCalculator: null}, label_hierarchy_level: 0}}
aggregator: {MeanAggregator: null}
ensemble: {ConcatenateEmbeddings: {normalize_embeddings: True, use_trunk_output: False}}
hook_container: {HookContainer: {primary_metric: mean_average_precision_at_r, validation_split_name: val}}
""",
    "config_dataset/default.yaml": """
dataset: {TinyVectors: {num_classes: 16, per_class: 8}}
splits_to_eval: [val]
split_manager: {ClassDisjointSplitManager: {test_size: 0.5, test_start_idx: 0.5, num_training_partitions: 4,
                num_training_sets: 4, hierarchy_level: 0, data_and_label_getter_keys: null}}
""",
}


def test_pb_0933_defaults_are_all_honoured(tmp_path, capsys):

    import yaml

    from pml_extensions.cli import run as cli
    from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

    register_tiny()
    root = write_tiny_config(str(tmp_path / "cfg"), PB_0933)
    assert cli.main([root, "--dry-run"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["hook_container"]["HookContainer"]["validation_split_name"] == "val" and cfg["api_parser"] is None


# ---------------------------------------------------------------------------------------------------------------------
# Issue 21, item 8: powerful-benchmarker's own v0.9.33 default folder (tests/runner/config/pb_v0_9_33_default: PB's
# files as it ships them) runs, overriding only the dataset and the trunk.
PB_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pb_v0_9_33_default")
#: the two overrides: a dataset of PB-style dict items, a small trunk (PB's is BN-Inception from ImageNet)
PB_OVERRIDES = [
    "--dataset~OVERRIDE~",
    "{PBStyleGlyphs: {}}",
    "--models~APPLY~1",
    "{trunk~OVERRIDE~: [{AdaptiveAvgPool2d: [4]}, {Flatten: null}, {Linear: {in_features: 48, out_features: 32}}]}",
]


class PBStyleGlyphs(torch.utils.data.Dataset):
    """Items as PB's datasets return them, ``{"data": PIL image, "label": int}`` (PB's default
    ``data_and_label_getter_keys: [data, label]`` reads them): 22 glyph classes x 12 images of 16 px, the fewest
    classes PB's default split and sampler take (:func:`pml_extensions.runner.objects.preflight.minimum_classes`)."""

    def __init__(self):
        from pml_extensions.datasets import GlyphDataset

        glyphs = GlyphDataset(split="all", image_size=16)
        keep = [i for c in range(22) for i in np.flatnonzero(glyphs.labels == c)[:12].tolist()]
        self.glyphs, self.indices = glyphs, keep
        self.labels = glyphs.labels[keep]

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        image, label = self.glyphs[self.indices[i]]
        return {"data": image, "label": label}


def register_pb_style_glyphs():
    from pml_extensions.runner.config.registry import register

    register(PBStyleGlyphs, role="dataset")


def test_pb_default_folder_loads_with_every_key_as_pb_wrote_it():
    from pml_extensions.runner.config.loader import parse_command_line
    from pml_extensions.runner.protocols import load_config

    register_pb_style_glyphs()
    cfg, sources = load_config(PB_DEFAULT, None, parse_command_line(PB_OVERRIDES))
    tester = cfg["tester"]["GlobalEmbeddingSpaceTester"]
    assert tester["visualizer"] == {} and tester["dataloader_num_workers"] == 2  # {}: no visualizer, as in PB
    assert cfg["log_data_to_tensorboard"] is True and cfg["api_parser"] is None
    assert cfg["split_manager"]["ClassDisjointSplitManager"]["data_and_label_getter_keys"] == ["data", "label"]
    assert pb_keys.tester_spec(cfg, sources)[1].get("visualizer") is None


def test_a_real_visualizer_is_refused_naming_tsne():
    from pml_extensions.runner.config.loader import parse_command_line
    from pml_extensions.runner.protocols import load_config

    register_pb_style_glyphs()
    argv = PB_OVERRIDES + ["--tester~APPLY~2", "{visualizer: {TSNE: {perplexity: 30}}}"]
    with pytest.raises(ConfigError) as e:
        load_config(PB_DEFAULT, None, parse_command_line(argv))
    message = str(e.value)
    assert message.startswith("command line: tester.GlobalEmbeddingSpaceTester.visualizer: embedding plots")
    assert "TSNE" in message and "set visualizer: {}" in message and "\n" not in message


def test_tensorboard_is_refused_in_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        pb_keys.check_values({"log_data_to_tensorboard": True}, {"log_data_to_tensorboard": "config_general.yaml"})
    assert str(e.value) == (
        "config_general.yaml: log_data_to_tensorboard: true needs the tensorboard package: pip install "
        "'pml_extensions[tensorboard]' (or pip install tensorboard), or set it to false; the CSV and SQLite logs are "
        "always written"
    )


@pytest.mark.slow
def test_pb_default_folder_runs_with_workers_and_tensorboard(tmp_path, subprocess_env):
    """The whole MLRC run of PB's defaults (2 data loading workers, TensorBoard logs; 1 of its 1000 epochs per fold:
    its patience of 9 let a fold train for minutes), in a child process: exit 0, no traceback (the issue saw 12 ignored
    `AssertionError: can only test a child process` with dataloader_num_workers: 2), scalars in every fold's
    TensorBoard folder."""
    import subprocess
    import sys

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code = (
        "import sys\nfrom tests.runner.config.test_pb_keys import register_pb_style_glyphs\n"
        "register_pb_style_glyphs()\nfrom pml_extensions.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    argv = ["run", PB_DEFAULT, *PB_OVERRIDES, "--num_epochs_train", "1", "--root_experiment_folder", str(tmp_path)]
    argv += ["--trainer~APPLY~2", "{iterations_per_epoch: 2}"]  # the workers and logs, not the training, are tested
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(PB_DEFAULT))),
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "can only test a child process" not in out.stderr, out.stderr[-3000:]
    folder = tmp_path / "pb_v0_9_33_default"
    results = json.loads((folder / "results.json").read_text())
    assert len(results["folds"]) == 4 and "concatenated_512D" in results["test"]
    for k in range(4):
        events = EventAccumulator(str(folder / f"fold_{k}" / "tensorboard"))
        events.Reload()
        tags = events.Tags()["scalars"]
        assert "accuracies_val/mean_average_precision_at_r" in tags and "loss_histories/total_loss" in tags


def test_a_dataset_by_name_merged_over_a_class_is_named_as_the_new_one():
    """--dataset "{name: csv, root: ...}" without ~OVERRIDE~ over the CUB class: the line named CUB as what the command
    line merged next to "a dataset by name", the other way round."""
    from pml_extensions.runner.config.loader import find_config, parse_command_line
    from pml_extensions.runner.protocols import load_config

    with pytest.raises(ConfigError) as e:
        load_config(find_config("contrastive"), None, parse_command_line(["--dataset", "{name: csv, root: x.csv}"]))
    assert str(e.value) == (
        "command line: dataset: 3 classes (CUB, name, root): a dataset by name (the command line) was merged next to "
        "CUB (the shipped configs/contrastive/config_dataset/default.yaml); a merge keeps both, write "
        "--dataset~OVERRIDE~ to replace it"
    )
