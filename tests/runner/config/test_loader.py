"""Config fixtures written in powerful-benchmarker's format (its docs' examples) parse, merge in order and
honour
~OVERRIDE~ / ~APPLY~ / ~SWAP~ / ~DELETE~, in YAML files and on the command line."""

import os

import pytest

from pml_extensions.runner.config.loader import (
    CONFIG_FOLDERS,
    load_yaml,
    merge,
    parse_command_line,
    split_selection,
)
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import load_config

GENERAL_DEFAULT = """
trainer:
  MetricLossOnly:
    iterations_per_epoch: 100
    dataloader_num_workers: 2
    batch_size: 32
    freeze_trunk_batchnorm: True
    label_hierarchy_level: 0
    loss_weights: null
    set_min_label_to_zero: True

num_epochs_train: 1000
save_interval: 2
patience: 9
"""
# powerful-benchmarker docs/yaml_syntax.md: with_daml swaps the trainer and applies its extra arguments
GENERAL_WITH_DAML = """
trainer~SWAP~1:
  DeepAdversarialMetricLearning:

trainer~APPLY~2:
  g_alone_epochs: 0
  metric_alone_epochs: 0
  loss_weights:
    metric_loss: 1
    synth_loss: 0.1
"""
OPTIMIZERS = """
optimizers:
  trunk_optimizer:
    RMSprop:
      lr: 0.000001
      weight_decay: 0.0001
      momentum: 0.9
  embedder_optimizer:
    RMSprop:
      lr: 0.000001
      weight_decay: 0.0001
      momentum: 0.9
"""
TRANSFORMS = """
transforms:
  train:
    Resize:
      size: 256
    RandomResizedCrop:
      scale: 0.16 1
      ratio: 0.75 1.33
      size: 227
    RandomHorizontalFlip:
      p: 0.5
  eval:
    Resize:
      size: 256
    CenterCrop:
      size: 227
"""


def write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(root)


@pytest.fixture
def root(tmp_path):
    return write(
        tmp_path,
        {
            "config_general/default.yaml": GENERAL_DEFAULT,
            "config_general/with_daml.yaml": GENERAL_WITH_DAML,
            "config_general/with_256_batch.yaml": "trainer~APPLY~2: {batch_size: 256}\n",
            "config_optimizers/default.yaml": OPTIMIZERS,
            "config_transforms/default.yaml": TRANSFORMS,
            "config_models/default.yaml": "models:\n  trunk:\n    resnet50:\n      pretrained: imagenet\n"
            "  embedder:\n    MLP:\n      layer_sizes:\n        - 128\n",
        },
    )


class TestMergeFiles:
    def test_default_only(self, root):
        cfg, sources = load_config(root)
        assert cfg["trainer"]["MetricLossOnly"]["batch_size"] == 32
        assert cfg["models"]["embedder"] == {"MLP": {"layer_sizes": [128]}}
        assert sources["optimizers"].endswith(os.path.join("config_optimizers", "default.yaml"))

    def test_swap_and_apply_from_docs(self, root):
        cfg, _ = load_config(root, {"config_general": ["default", "with_daml"]})
        # the docs' expected result: the trainer class is swapped, its arguments kept (in order) and extended
        trainer = cfg["trainer"]
        assert list(trainer) == ["DeepAdversarialMetricLearning"]
        args = trainer["DeepAdversarialMetricLearning"]
        assert list(args)[:7] == [
            "iterations_per_epoch",
            "dataloader_num_workers",
            "batch_size",
            "freeze_trunk_batchnorm",
            "label_hierarchy_level",
            "loss_weights",
            "set_min_label_to_zero",
        ]
        assert args["loss_weights"] == {"metric_loss": 1, "synth_loss": 0.1}
        assert args["g_alone_epochs"] == 0 and args["batch_size"] == 32

    def test_files_merge_in_the_given_order(self, root):
        write(root, {"config_general/with_64_batch.yaml": "trainer~APPLY~2: {batch_size: 64}\n"})
        a, _ = load_config(root, {"config_general": ["default", "with_256_batch", "with_64_batch"]})
        b, _ = load_config(root, {"config_general": ["default", "with_64_batch", "with_256_batch"]})
        assert a["trainer"]["MetricLossOnly"]["batch_size"] == 64
        assert b["trainer"]["MetricLossOnly"]["batch_size"] == 256

    def test_command_line_is_merged_last(self, root):
        cli = parse_command_line(["--optimizers~APPLY~3", "{lr:", "0.005}", "--save_interval", "5"])
        cfg, sources = load_config(root, None, cli)
        assert cfg["optimizers"]["trunk_optimizer"]["RMSprop"] == {
            "lr": 0.005,
            "weight_decay": 0.0001,
            "momentum": 0.9,
        }
        assert cfg["optimizers"]["embedder_optimizer"]["RMSprop"]["lr"] == 0.005
        assert cfg["save_interval"] == 5 and sources["save_interval"] == "command line"


class TestMarkers:
    base = {"optimizers": {"trunk_optimizer": {"RMSprop": {"lr": 1e-6}}}}

    def test_plain_merge_adds_keys(self):
        # docs/cl_syntax.md "Merge": lr changes, alpha is added
        out = merge(self.base, {"optimizers": {"trunk_optimizer": {"RMSprop": {"lr": 0.01, "alpha": 0.95}}}})
        assert out == {"optimizers": {"trunk_optimizer": {"RMSprop": {"lr": 0.01, "alpha": 0.95}}}}
        assert self.base["optimizers"]["trunk_optimizer"]["RMSprop"] == {"lr": 1e-6}  # inputs untouched

    def test_merge_without_override_keeps_both_classes(self):
        out = merge(self.base, {"optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.01}}}})
        assert set(out["optimizers"]["trunk_optimizer"]) == {"RMSprop", "Adam"}

    def test_override_at_any_level(self):
        top = merge(self.base, {"optimizers~OVERRIDE~": {"trunk_optimizer": {"Adam": {"lr": 0.01}}}})
        inner = merge(
            {
                "optimizers": {
                    "trunk_optimizer": {"RMSprop": {}},
                    "embedder_optimizer": {"Adam": {"lr": 0.01}},
                }
            },
            {"optimizers": {"trunk_optimizer~OVERRIDE~": {"Adam": {"lr": 0.01}}}},
        )
        assert top == {"optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.01}}}}
        assert inner == {
            "optimizers": {
                "trunk_optimizer": {"Adam": {"lr": 0.01}},
                "embedder_optimizer": {"Adam": {"lr": 0.01}},
            }
        }

    def test_swap_with_explicit_mapping_keeps_order(self):
        cfg = {"transforms": {"train": {"Resize": {"size": 256}, "RandomHorizontalFlip": {"p": 0.5}, "CenterCrop": {}}}}
        out = merge(cfg, {"transforms~SWAP~2": {"RandomHorizontalFlip": "RandomVerticalFlip"}})
        assert list(out["transforms"]["train"]) == ["Resize", "RandomVerticalFlip", "CenterCrop"]
        assert out["transforms"]["train"]["RandomVerticalFlip"] == {"p": 0.5}

    def test_apply_fills_null_kwargs(self):
        out = merge(
            {"loss_funcs": {"metric_loss": {"ContrastiveLoss": None}}},
            {"loss_funcs~APPLY~3": {"neg_margin": 2}},
        )
        assert out == {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {"neg_margin": 2}}}}

    def test_delete(self):
        out = merge(
            {"optimizers": {"trunk_optimizer": {}, "embedder_optimizer": {}}},
            {"optimizers": {"embedder_optimizer~DELETE~": {}}},
        )
        assert out == {"optimizers": {"trunk_optimizer": {}}}

    def test_markers_inside_an_inserted_value_are_resolved(self):
        out = merge({}, {"a": {"b~OVERRIDE~": 1}})
        assert out == {"a": {"b": 1}}

    @pytest.mark.parametrize(
        "update, message",
        [
            ({"missing~APPLY~2": {"x": 1}}, "'missing' does not exist"),
            ({"trainer~SWAP~1": {"A": None, "B": None}}, None),
            ({"trainer~APPLY~": {"x": 1}}, "needs a depth"),
            ({"trainer~APPLY~1": 3}, "needs a mapping"),
        ],
    )
    def test_marker_errors(self, update, message):
        base = {"trainer": {"X": {}, "Y": {}}}
        with pytest.raises(ConfigError, match=message):
            merge(base, update, "f.yaml")


class TestCommandLine:
    def test_values_span_words_and_are_yaml(self):
        cli = parse_command_line(
            [
                "--config_general",
                "[default,",
                "with_daml]",
                "--optimizers",
                "{trunk_optimizer:",
                "{Adam:",
                "{lr:",
                "0.01}}}",
                "--patience",
                "null",
                "--flag",
                "--trainer~SWAP~1",
                "{CascadedEmbeddings:",
                "null}",
            ]
        )
        assert cli == {
            "config_general": ["default", "with_daml"],
            "optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.01}}},
            "patience": None,
            "flag": True,
            "trainer~SWAP~1": {"CascadedEmbeddings": None},
        }
        selection, rest = split_selection(cli)
        assert selection == {"config_general": ["default", "with_daml"]} and "config_general" not in rest

    def test_trailing_colon_of_flag_is_accepted(self):
        assert parse_command_line(["--trainer~APPLY~2:", "{batch_size:", "256}"]) == {
            "trainer~APPLY~2": {"batch_size": 256}
        }

    def test_a_bare_double_dash_is_skipped(self):
        # a user typed the README's `tox -e job -- --num_epochs 2` as `job -- --num_epochs 2` and got "'--': value
        # without a --flag"; after `--device cpu` the `--` became part of the value ('cpu --')
        assert parse_command_line(["--", "--num_epochs", "2"]) == {"num_epochs": 2}
        assert parse_command_line(["--device", "cpu", "--", "--num_epochs", "2"]) == {"device": "cpu", "num_epochs": 2}

    def test_errors_are_one_line(self):
        with pytest.raises(ConfigError, match=r"^command line: 'stray'"):
            parse_command_line(["stray"])
        with pytest.raises(ConfigError) as e:
            parse_command_line(["--optimizers", "{trunk_optimizer:", "{Adam}"])
        assert str(e.value).startswith("command line: --optimizers: malformed YAML") and "\n" not in str(e.value)


class TestFileErrors:
    def test_missing_file_names_file_and_selection(self, root):
        with pytest.raises(ConfigError) as e:
            load_config(root, {"config_general": ["default", "with_nothing"]})
        msg = str(e.value)
        assert "with_nothing.yaml: missing config file" in msg and "config_general" in msg and "\n" not in msg

    def test_malformed_yaml_names_file_line_and_key(self, root):
        write(
            root,
            {
                "config_eval/default.yaml": "eval_batch_size: "
                "32\neval_accuracy_calculator:\n  AccuracyCalculator: {k: [1, 2}\n"
            },
        )
        with pytest.raises(ConfigError) as e:
            load_config(root)
        msg = str(e.value)
        assert os.path.join("config_eval", "default.yaml:3") in msg
        assert "key 'AccuracyCalculator'" in msg and "malformed YAML" in msg and "\n" not in msg

    def test_top_level_must_be_mapping(self, tmp_path):
        path = write(tmp_path, {"x.yaml": "- a\n- b\n"})
        with pytest.raises(ConfigError, match="top level must be a mapping"):
            load_yaml(os.path.join(path, "x.yaml"))

    def test_unknown_folder_in_selection(self, root):
        with pytest.raises(ConfigError, match="unknown config folder"):
            load_config(root, {"config_nonsense": ["default"]})

    def test_bayesian_marker_is_refused_with_one_line(self, root):
        write(
            root,
            {
                "config_loss_and_miners/default.yaml": "loss_funcs:\n  metric_loss:\n "
                "   MultiSimilarityLoss:\n      alpha~LOG_BAYESIAN~: [0.01, 100]\n"
            },
        )
        with pytest.raises(ConfigError) as e:
            load_config(root)
        msg = str(e.value)
        assert "config_loss_and_miners" in msg and "alpha~LOG_BAYESIAN~" in msg and "\n" not in msg

    def test_folders_constant(self):
        assert CONFIG_FOLDERS == (
            "config_general",
            "config_models",
            "config_loss_and_miners",
            "config_optimizers",
            "config_transforms",
            "config_eval",
            "config_factories",
            "config_dataset",
        )


def test_a_flag_given_twice_is_refused_not_replaced():
    """`--trainer~APPLY~2 "{batch_size: 16}" --trainer~APPLY~2 "{iterations_per_epoch: 10}"` kept only the second
    (the batch size was silently lost)."""
    with pytest.raises(ConfigError, match=r"^command line: --trainer~APPLY~2: given twice; give it once"):
        parse_command_line(["--trainer~APPLY~2", "{batch_size: 16}", "--trainer~APPLY~2", "{iterations_per_epoch: 1}"])


def test_command_line_variants_keep_their_markers_and_untrained_comparisons_stay(tmp_path):
    """--variants~OVERRIDE~ '{g: {loss_funcs: {metric_loss~OVERRIDE~: ...}}}' lost the inner marker, so the variant's
    loss was merged into the config's XMLWrapper instead of replacing it; --variants a (names) dropped the
    comparisons with the untrained row although untrained: true."""
    from pml_extensions.runner.config.loader import merge_config, select_variants, variant_configs
    from pml_extensions.runner.errors import ConfigError

    (tmp_path / "config_general.yaml").write_text(
        "loss_funcs: {metric_loss: {XMLWrapper: {loss: {ContrastiveLoss: {}}}}}\n"
        "untrained: true\nvariants: {x: {}}\ncomparisons: [[x, untrained]]\n"
    )
    g = {"loss_funcs": {"metric_loss~OVERRIDE~": {"TripletMarginLoss": {}}}}
    config, sources = merge_config(str(tmp_path), overrides={"variants~OVERRIDE~": {"g": g, "x": {}}})
    assert config["variants"] == {"g": g, "x": {}} and sources["variants"] == "command line"
    assert variant_configs(config)["g"]["loss_funcs"] == {"metric_loss": {"TripletMarginLoss": {}}}
    added, _ = merge_config(str(tmp_path), overrides={"variants": {"g": g}})
    assert list(added["variants"]) == ["x", "g"]
    assert select_variants(added, ["x"])["comparisons"] == [["x", "untrained"]]
    with pytest.raises(ConfigError, match=r"^command line: --variants~APPLY~2: a variant's entry is a set of changes"):
        merge_config(str(tmp_path), overrides={"variants~APPLY~2": {"seed": 1}})


@pytest.mark.parametrize(
    "text, where",
    [
        # a user's `iterations_per_epoch: [40` on line 2 was reported at line 3's key (where PyYAML noticed it)
        (
            "num_epochs: 2\niterations_per_epoch: [40\nbatch_size: 32\n",
            ":2: key 'iterations_per_epoch': malformed YAML: expected ',' or ']', but got ':' "
            "(opened on this line, still open on line 3)",
        ),
        (
            "a: 1\nb: {x: 1\nc: 3\n",
            ":2: key 'b': malformed YAML: expected ',' or '}', but got ':' (opened on this line",
        ),
        ("a: 1\nb: 'xx\nc: 3\n", ":2: key 'b': malformed YAML: found unexpected end of stream (opened on this line"),
        ("a: 1\n  b: 2\nc: 3\n", ":2: key 'b': malformed YAML: mapping values are not allowed here"),  # unchanged
    ],
)
def test_an_unclosed_bracket_or_quote_is_reported_where_it_opened(tmp_path, text, where):
    path = tmp_path / "config_general.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_yaml(str(path))
    assert where in str(e.value) and "\n" not in str(e.value)
