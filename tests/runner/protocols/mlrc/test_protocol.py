"""runner/protocols/mlrc/protocol.py: the MLRC protocol on tiny data (folds, early stopping, test, hooks, errors)."""

import json
import os

import numpy as np
import pytest
import torch

from pml_extensions.runner.config.loader import parse_command_line
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import load_config, run_protocol
from pml_extensions.runner.protocols.mlrc.runner import MLRCRunner
from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

register_tiny()


def _runner(tmp_path, argv=(), files=None):
    root = write_tiny_config(str(tmp_path / "cfg"), files)
    cfg, sources = load_config(root, None, parse_command_line(list(argv)))
    return MLRCRunner(cfg, str(tmp_path / "exp"), sources, log=lambda *a: None)


def _run(runner):
    """The protocol through the one entry point (saves config.yaml, writes report.html)."""
    return run_protocol(runner.config, runner.folder, runner.experiment.sources, log=lambda *a: None)


class TestRunner:
    def test_full_protocol_on_tiny_data(self, tmp_path):
        results = _run(_runner(tmp_path, ["--num_epochs_train", "2"]))
        assert len(results["folds"]) == 4
        test = results["test"]
        assert set(test) == {"separate_8D", "concatenated_32D", "per_model"}
        for key in ("separate_8D", "concatenated_32D"):
            assert set(test[key]) == {"mean_average_precision_at_r", "precision_at_1", "r_precision"}
        assert results["test_classes"] == list(range(8, 16))
        for k, fold in enumerate(results["folds"]):
            assert set(fold["val_classes"]) == {2 * k, 2 * k + 1}
            assert os.path.exists(fold["best_path"])
            rows = json.load(open(tmp_path / "exp" / "results.json"))["folds"][k]
            assert rows["best_epoch"] == fold["best_epoch"]
        assert (tmp_path / "exp" / "report.html").exists()

    def test_early_stopping_with_patience(self, tmp_path):
        # lr 0 -> the metric never improves after epoch 0 -> stop once epoch - best_epoch > patience
        runner = _runner(
            tmp_path,
            [
                "--num_epochs_train",
                "20",
                "--patience",
                "1",
                "--num_training_sets",
                "1",
                "--optimizers~APPLY~3",
                "{lr:",
                "0.0}",
            ],
        )
        logs = []
        results = run_protocol(runner.config, runner.folder, runner.experiment.sources, log=logs.append)
        from pml_extensions.runner.experiment.checkpoint import load_weights

        state = load_weights(str(tmp_path / "exp" / "fold_0" / "checkpoint.pth"))
        assert results["folds"][0]["best_epoch"] == 0
        assert state["epoch"] == 2 and state["finished"]
        # the header says what the fold then did (it said "early stopping after 1 without a better one": 2 passed)
        (header,) = [line for line in logs if "of at most" in line]
        assert header.endswith("1 fold of at most 20 epochs (a fold stops once 2 epochs pass without a better "
                               "validation (patience 1))")  # fmt: skip
        assert [line.split(": val")[0] for line in logs if ": val " in line] == [
            "fold 0 epoch 0 (untrained)", "fold 0 epoch 1", "fold 0 epoch 2"
        ]  # fmt: skip

    def test_frozen_batchnorm_trunk(self, tmp_path):
        files = {
            "config_models/default.yaml": """
models:
  trunk:
    - Flatten: null
    - Linear: {in_features: 16, out_features: 16}
    - BatchNorm1d: [16]
  embedder:
    MLP: {layer_sizes: [8]}
"""
        }
        runner = _runner(
            tmp_path,
            [
                "--num_epochs_train",
                "1",
                "--num_training_sets",
                "1",
                "--trainer~APPLY~2",
                "{freeze_trunk_batchnorm:",
                "true}",
            ],
            files,
        )
        _run(runner)
        from pml_extensions.runner.experiment.checkpoint import load_weights

        sd = load_weights(str(tmp_path / "exp" / "fold_0" / "checkpoint.pth"))["models"]["trunk"]
        assert torch.equal(sd["2.running_mean"], torch.zeros(16))  # never updated: BN stayed in eval mode
        assert int(sd["2.num_batches_tracked"]) == 0

    def test_proxy_loss_gets_num_classes_and_embedding_size(self, tmp_path):
        runner = _runner(
            tmp_path, ["--loss_funcs~OVERRIDE~", "{metric_loss:", "{ProxyAnchorLoss:", "{margin:", "0.1}}}"]
        )
        models = runner.builder.build_models(torch.zeros(1, 4, 4))
        losses, _ = runner.builder.build_losses(models, num_classes=6)
        assert tuple(losses["metric_loss"].proxies.shape) == (6, 8)

    def test_embedder_mlp_gets_trunk_width(self, tmp_path):
        models = _runner(tmp_path).builder.build_models(torch.zeros(1, 4, 4))
        assert models["embedder"].layer_sizes == [16, 8]

    @pytest.mark.parametrize(
        "argv, match",
        [
            (
                ["--models~OVERRIDE~", "{trunk:", "{bninception:", "{pretrained:", "imagenet}}}"],
                r"^command line: models.trunk: unknown class 'bninception'",
            ),
            (
                ["--loss_funcs", "{metric_loss:", "{ContrastiveLoss:", "{neg_margn:", "1}}}"],
                r"^command line: loss_funcs.metric_loss.ContrastiveLoss: bad arguments: .*neg_margn",
            ),
            (["--optimizers", "{head_optimizer:", "{Adam:", "{}}}"], r"no model or loss called 'head'"),
        ],
    )
    def test_build_errors_name_file_and_key(self, tmp_path, argv, match):
        with pytest.raises(ConfigError, match=match) as e:  # a keyword no class takes: refused as the config loads
            runner = _runner(tmp_path, argv)
            models = runner.builder.build_models(torch.zeros(1, 4, 4))
            losses, _ = runner.builder.build_losses(models, 4)
            runner.builder.build_optimizers(models, losses)
        assert "\n" not in str(e.value)

    def test_errors_from_files_name_the_file(self, tmp_path):
        files = {"config_loss_and_miners/default.yaml": "loss_funcs:\n  metric_loss:\n    ContrastivLoss: {}\n"}
        with pytest.raises(ConfigError) as e:  # an unknown class: refused as the config loads, before any model
            runner = _runner(tmp_path, [], files)
            runner.builder.build_losses(runner.builder.build_models(torch.zeros(1, 4, 4)), 4)
        msg = str(e.value)
        assert msg.startswith(os.path.join(str(tmp_path), "cfg", "config_loss_and_miners", "default.yaml"))
        assert "loss_funcs.metric_loss" in msg and "'ContrastivLoss'" in msg

    def test_custom_factory_refused(self, tmp_path):
        with pytest.raises(ConfigError, match="custom factory"):
            _runner(tmp_path, ["--factories", "{model:", "{MyModelFactory:", "{}}}"])


class RecordingHook:
    """A stand-in end_of_testing_hook: records its arguments and writes one PNG into output_dir."""

    calls = []

    def __init__(self, trunk, embedder, dataset_dict, output_dir, note="x"):
        self.args = (trunk, embedder, dataset_dict, output_dir, note)

    def end_of_testing_hook(self, tester):
        import base64

        os.makedirs(self.args[3], exist_ok=True)
        png = base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
        )
        with open(os.path.join(self.args[3], "grid.png"), "wb") as f:
            f.write(png)
        RecordingHook.calls.append((self.args, sorted(tester.embeddings_and_labels)))


def test_test_hooks_run_once_and_reach_the_report(tmp_path):
    from pml_extensions.runner.config.registry import register

    register(RecordingHook, role="hook")
    RecordingHook.calls.clear()
    runner = _runner(
        tmp_path,
        [
            "--num_epochs_train",
            "1",
            "--num_training_sets",
            "2",
            "--test_hooks",
            "{explain:",
            "{RecordingHook:",
            "{note:",
            "y}}}",
        ],
    )
    _run(runner)
    assert len(RecordingHook.calls) == 1
    (trunk, embedder, dataset_dict, output_dir, note), splits = RecordingHook.calls[0]
    assert splits == ["test"] and list(dataset_dict) == ["test"] and note == "y"
    assert sorted(set(dataset_dict["test"].labels.tolist())) == list(range(8, 16))
    assert output_dir == str(tmp_path / "exp" / "explanations")
    html = open(tmp_path / "exp" / "report.html").read()
    assert "explanations/grid.png" in html or os.path.join("explanations", "grid.png") in html


def test_loss_generators_are_found_for_the_checkpoint():
    from pytorch_metric_learning.losses import ContrastiveLoss

    from pml_extensions.losses.xml_wrapper import XMLWrapper
    from pml_extensions.runner.experiment.checkpoint import module_generators

    loss = XMLWrapper(ContrastiveLoss(), seed=3)
    gens = module_generators({"metric_loss": loss})
    assert list(gens) == ["metric_loss.generator"] and gens["metric_loss.generator"] is loss.generator
    state = gens["metric_loss.generator"].get_state()
    a = torch.randperm(10, generator=loss.generator)
    loss.generator.set_state(state)
    assert torch.equal(a, torch.randperm(10, generator=loss.generator))


@pytest.mark.parametrize("value", ["0", "abc", "-4", "true"])
def test_bad_batch_size_is_one_config_error(tmp_path, value):
    """batch_size 0 used to end in a ZeroDivisionError inside PML's sampler, 'abc' in int(); now one line."""
    register_tiny()
    with pytest.raises(ConfigError, match=r"trainer: batch_size must be a positive integer, got ") as e:
        _run(_runner(tmp_path, ["--trainer~APPLY~2", "{batch_size: %s}" % value, "--num_training_sets", "1"]))
    assert "\n" not in str(e.value)


CACHED_MODELS = """
models:
  trunk:
    - Flatten: null
    - FixedLinear: {in_features: 16, out_features: 16}
    - ReLU: {}
    - Linear: {in_features: 16, out_features: 16}
  embedder:
    MLP:
      layer_sizes: [8]
"""


@pytest.mark.slow
def test_feature_cache_trains_the_rest_on_cached_features_with_the_same_results(tmp_path):
    """A fixed prefix (Flatten + FixedLinear) cached: every fold trains the rest (ReLU + Linear) on its cached
    outputs; with a deterministic transform the views equal the images', so the run equals the uncached one with
    the prefix frozen (``FrozenPrefix``)."""
    from pml_extensions.datasets import CachedFeatureDataset

    files = {"config_models/default.yaml": CACHED_MODELS}
    argv = ["--num_epochs_train", "2", "--num_training_sets", "2"]
    frozen = CACHED_MODELS.replace(
        "    - Flatten: null\n    - FixedLinear: {in_features: 16, out_features: 16}\n",
        "    - FrozenPrefix: {prefix: {Sequential: [{Flatten: null},\n"
        "        {FixedLinear: {in_features: 16, out_features: 16}}]}}\n",
    )
    assert frozen != CACHED_MODELS
    plain = _run(_runner(tmp_path / "plain", argv, {"config_models/default.yaml": frozen}))
    cache = ["--feature_cache", "{boundary: '1', num_views: 2, dtype: float32}"]
    runner = _runner(tmp_path / "cached", argv + cache, files)
    seen = []
    original = MLRCRunner.view

    def spy(self, part, *args, **kwargs):
        view = original(self, part, *args, **kwargs)
        if part == "train":
            seen.append(view)
        return view

    MLRCRunner.view = spy
    try:
        cached = _run(runner)
    finally:
        MLRCRunner.view = original
    assert all(isinstance(v.dataset, CachedFeatureDataset) for v in seen) and len(seen) == 2
    assert [v.dataset.seed for v in seen] == [0, 1]  # each fold draws its views with its own seed
    folder = tmp_path / "cached" / "exp" / "feature_cache" / "1"
    assert sorted(os.listdir(folder)) == ["eval", "eval.lock", "train", "train.lock"]
    assert json.load(open(folder / "train" / "meta.json"))["num_items"] == 64  # the train/val pool only
    for a, b in zip(plain["folds"], cached["folds"]):
        assert a["best_epoch"] == b["best_epoch"]
        assert a["best_val_metrics"] == pytest.approx(b["best_val_metrics"], abs=1e-6)
    for key in ("separate_8D", "concatenated_16D"):
        assert plain["test"][key] == pytest.approx(cached["test"][key], abs=1e-6)


def test_feature_cache_refuses_test_hooks_and_a_random_prefix(tmp_path):
    hooks = ["--test_hooks", "{h: {ExplanationHook: {}}}", "--feature_cache", "{boundary: '1'}"]
    files = {"config_models/default.yaml": CACHED_MODELS}
    with pytest.raises(ConfigError, match=r"feature_cache: test_hooks explain images with the whole trunk"):
        _run(_runner(tmp_path / "a", hooks, files))
    with pytest.raises(ConfigError, match=r"feature_cache: the frozen prefix of models.trunk changes with the seed"):
        _run(_runner(tmp_path / "b", ["--feature_cache", "{boundary: '1'}"]))


class TestYourSplit:
    """A CSV's split column is honoured by the mlrc protocol (its test rows' classes are the test classes) or, when
    its test rows share classes with its training rows, refused in one line with the ways out; a user can name the
    test classes (``split_manager``'s ``test_classes``)."""

    def _csv(self, tmp_path, rows):
        path = tmp_path / "catalogue.csv"
        path.write_text(
            "sku,category,image,subset\n" + "".join(f"{i},{c},{i}.jpg,{s}\n" for i, (c, s) in enumerate(rows))
        )
        return str(path)

    def test_a_class_disjoint_split_column_names_the_test_classes(self, tmp_path):
        from pml_extensions.runner.protocols.mlrc.protocol import MLRC

        rows = [("Sneakers", "train"), ("T-Shirts / Tops", "train"), ("Sandalen & Ära", "test"), ("Boots", "test")]
        path = self._csv(tmp_path, rows)
        update = MLRC.data_folder(path, True, {"label": "category", "path": "image", "split": "subset"})
        assert update["split_manager"] == {"ClassDisjointSplitManager": {"test_classes": ["Boots", "Sandalen & Ära"]}}
        assert update["dataset~OVERRIDE~"]["ImageCSVSplit"]["split"] == "all"
        no_split = MLRC.data_folder(path, True, {"label": "category", "path": "image"})
        assert "split_manager" not in no_split  # no split column mapped: mlrc splits the classes itself

    def test_a_split_sharing_classes_is_refused_with_the_ways_out(self, tmp_path):
        from pml_extensions.runner.protocols.mlrc.protocol import MLRC

        path = self._csv(tmp_path, [("Sneakers", "train"), ("Sneakers", "test"), ("Boots", "test")])
        with pytest.raises(ConfigError) as e:
            MLRC.data_folder(path, True, {"label": "category", "path": "image", "split": "subset"})
        assert str(e.value) == (
            f"command line: --data_folder {path}: its 'subset' column puts 1 classes in both the training and the test "
            "rows (Sneakers); the mlrc protocol tests on classes it never trained on: make the split class-disjoint, "
            "or map no split column (--columns label=category,path=image) and mlrc splits the classes itself, or run "
            "a paired config with class_overlap: allowed in the dataset's kwargs (same-class retrieval)"
        )

    def test_test_classes_by_name_with_did_you_mean(self, tmp_path):
        from pml_extensions.runner.protocols.mlrc import mlrc_class_splits

        s = mlrc_class_splits(list(range(10)), num_training_partitions=2, test_classes=[7, 2])
        assert s["test"] == [2, 7] and sorted(s["trainval"]) == [0, 1, 3, 4, 5, 6, 8, 9]
        runner = _runner(tmp_path, ["--split_manager", "{ClassDisjointSplitManager: {test_classes: [class_3]}}"])
        base = type("Base", (), {"classes": [f"class_{i}" for i in range(16)]})()
        assert runner.test_class_labels(base, np.arange(16), ["class_3", 4]) == [3, 4]
        with pytest.raises(
            ConfigError, match=r"test_classes: the dataset has no class 'clas_5'; did you mean 'class_5'"
        ):
            runner.test_class_labels(base, np.arange(16), ["clas_5"])


class EpochHook(RecordingHook):
    """A test hook that takes ``epoch``: the protocol fills in fold 0's best epoch (the hook is called at epoch 0)."""

    def __init__(self, trunk, embedder, dataset_dict, output_dir, epoch=None):
        super().__init__(trunk, embedder, dataset_dict, output_dir, note=epoch)


def test_test_hooks_get_the_best_epoch_of_the_tested_model(tmp_path):
    import json

    from pml_extensions.runner.config.registry import register

    register(EpochHook, role="hook")
    RecordingHook.calls.clear()
    runner = _runner(
        tmp_path,
        ["--num_epochs_train", "2", "--num_training_sets", "2", "--test_hooks", "{explain:", "{EpochHook:", "{}}}"],
    )
    _run(runner)
    results = json.load(open(tmp_path / "exp" / "results.json"))
    assert RecordingHook.calls[0][0][4] == results["folds"][0]["best_epoch"]


def test_a_fold_resumed_from_its_checkpoint_is_not_timed_as_a_whole_fold(tmp_path):
    """The "one fold took ..." estimate times the first fold this call trains from its start: fold 0 resumes from its
    checkpoint.pth, so fold 1 is timed."""
    root = write_tiny_config(str(tmp_path / "cfg"))
    cfg, sources = load_config(root, None, parse_command_line([]))
    lines = []
    runner = MLRCRunner(cfg, str(tmp_path / "exp"), sources, log=lambda line, *a: lines.append(str(line)))
    os.makedirs(tmp_path / "exp" / "fold_0")
    (tmp_path / "exp" / "fold_0" / "checkpoint.pth").write_bytes(b"")
    estimates = []  # the "one fold took" lines logged before each fold

    def train_fold(k, *args):
        estimates.append(sum("one fold took" in line for line in lines))
        if k == 2:
            raise KeyboardInterrupt
        runner.trained = True
        return {}

    runner.train_fold = train_fold
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert estimates == [0, 0, 1]
