"""PB markers nested in one another (a table of inputs and expected merges), unknown keys and PB's old spellings."""

import os

import pytest

from pml_extensions.runner.config.loader import find_config, merge, parse_command_line, variant_configs
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import load_config

T = {"tester": {"T": {"batch_size": 32, "accuracy_calculator": {"AccuracyCalculator": {"k": "max_bin_count"}}}}}

CASES = [
    # the issue's example: ~OVERRIDE~ inside ~APPLY~ replaces the calculator, it does not add a second one
    (
        "override in apply",
        T,
        {"tester~APPLY~2": {"accuracy_calculator~OVERRIDE~": {"ChunkedAccuracyCalculator": {"chunk_size": 64}}}},
        {"tester": {"T": {"batch_size": 32, "accuracy_calculator": {"ChunkedAccuracyCalculator": {"chunk_size": 64}}}}},
    ),
    # a plain key inside ~APPLY~ merges (PB's merge keeps both class names; ~OVERRIDE~ is how to replace)
    (
        "plain in apply merges",
        T,
        {"tester~APPLY~2": {"accuracy_calculator": {"AccuracyCalculator": {"k": 5}}}},
        {"tester": {"T": {"batch_size": 32, "accuracy_calculator": {"AccuracyCalculator": {"k": 5}}}}},
    ),
    # ~SWAP~ inside ~APPLY~: renames the calculator class, keeps its arguments
    (
        "swap in apply",
        T,
        {"tester~APPLY~2": {"accuracy_calculator~SWAP~1": {"ChunkedAccuracyCalculator": None}}},
        {
            "tester": {
                "T": {"batch_size": 32, "accuracy_calculator": {"ChunkedAccuracyCalculator": {"k": "max_bin_count"}}}
            }
        },
    ),
    # ~SWAP~ inside ~OVERRIDE~ acts on the old value being replaced; unnamed keys are dropped
    (
        "swap in override",
        T,
        {"tester~OVERRIDE~": {"T": {"accuracy_calculator~SWAP~1": {"C": None}}}},
        {"tester": {"T": {"accuracy_calculator": {"C": {"k": "max_bin_count"}}}}},
    ),
    # ~APPLY~ inside ~OVERRIDE~
    (
        "apply in override",
        T,
        {"tester~OVERRIDE~": {"T": {"accuracy_calculator~APPLY~2": {"k": 1}}}},
        {"tester": {"T": {"accuracy_calculator": {"AccuracyCalculator": {"k": 1}}}}},
    ),
    # ~DELETE~ inside ~APPLY~
    (
        "delete in apply",
        T,
        {"tester~APPLY~2": {"batch_size~DELETE~": None}},
        {"tester": {"T": {"accuracy_calculator": {"AccuracyCalculator": {"k": "max_bin_count"}}}}},
    ),
    # ~OVERRIDE~ inside a plain merge, at depth 3
    (
        "override in plain",
        T,
        {"tester": {"T": {"accuracy_calculator~OVERRIDE~": {"C": {}}}}},
        {"tester": {"T": {"batch_size": 32, "accuracy_calculator": {"C": {}}}}},
    ),
    # ~APPLY~ inside ~APPLY~
    (
        "apply in apply",
        {"o": {"a": {"X": {"lr": 1}}, "b": {"Y": {"lr": 1}}}},
        {"o~APPLY~1": {"a~APPLY~2": {"lr": 2}}},
        {"o": {"a": {"X": {"lr": 2}}, "b": {"Y": {"lr": 1}}}},
    ),
    # ~APPLY~ fills a null (PB replaced non-mappings at the applied depth)
    (
        "apply fills null",
        {"l": {"m": {"ContrastiveLoss": None}}},
        {"l~APPLY~3": {"neg_margin": 2}},
        {"l": {"m": {"ContrastiveLoss": {"neg_margin": 2}}}},
    ),
    # ~DELETE~ inside ~OVERRIDE~ of a key that exists only in the old value: nothing to keep
    ("delete in override", {"o": {"a": 1, "b": 2}}, {"o~OVERRIDE~": {"a~DELETE~": None, "c": 3}}, {"o": {"c": 3}}),
    # a later plain value replaces a search marker and vice versa
    ("plain replaces bayesian", {"lr~BAYESIAN~": [0, 1]}, {"lr": 0.5}, {"lr": 0.5}),
    ("bayesian replaces plain", {"lr": 0.5}, {"lr~LOG_BAYESIAN~": [0.1, 1]}, {"lr~LOG_BAYESIAN~": [0.1, 1]}),
    # ~SWAP~ inside a plain merge, explicit mapping keeps the order
    (
        "swap in plain",
        {"t": {"train": {"A": 1, "B": 2, "C": 3}}},
        {"t": {"train~SWAP~1": {"B": "D"}}},
        {"t": {"train": {"A": 1, "D": 2, "C": 3}}},
    ),
]


@pytest.mark.parametrize("name, base, update, expected", CASES, ids=[c[0] for c in CASES])
def test_nested_markers(name, base, update, expected):
    out = merge(base, update, "f.yaml")
    assert out == expected
    if isinstance(expected, dict):
        assert list(out) == list(expected)


def test_issue_example_from_the_command_line():
    cli = parse_command_line(
        ["--tester~APPLY~2", "{accuracy_calculator~OVERRIDE~: {ChunkedAccuracyCalculator: {chunk_size: 64}}}"]
    )
    out = merge(T, cli, "command line")
    assert out["tester"]["T"]["accuracy_calculator"] == {"ChunkedAccuracyCalculator": {"chunk_size": 64}}


@pytest.mark.parametrize(
    "update, message",
    [
        ({"tester~OVERRIDE~": {"Other": {"x~SWAP~1": {"C": None}}}}, "target 'x' does not exist"),
        ({"t~SWAP~1": {"Missing": "New"}}, "no key 'Missing' here"),
    ],
)
def test_nested_marker_errors(update, message):
    with pytest.raises(ConfigError, match=message):
        merge({"tester": {"T": {}}, "t": {"A": {}}}, update, "f.yaml")


QUICK = {"config_general": ["default", "quick"]}


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--num_epochs", "1"],
            "command line: --num_epochs: no config file defines this key .* did you mean num_epochs_train",
        ),
        (["--bogus_key", "3"], "command line: --bogus_key: no config file defines this key .* did you mean "),
    ],
)
def test_unknown_command_line_key_names_the_nearest(argv, message):
    with pytest.raises(ConfigError, match=message):
        load_config(find_config("contrastive"), QUICK, parse_command_line(argv))


def test_known_key_not_in_files_is_accepted():
    cfg, src = load_config(find_config("contrastive"), QUICK, parse_command_line(["--dataset_root", "/data"]))
    assert cfg["dataset_root"] == "/data" and src["dataset_root"] == "command line"


def test_typo_in_a_yaml_key_is_an_error(tmp_path):
    (tmp_path / "config_general").mkdir()
    (tmp_path / "config_general" / "default.yaml").write_text("num_epoch_train: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path))
    msg = str(e.value)
    assert "num_epoch_train" in msg and "did you mean num_epochs_train" in msg and "\n" not in msg


def test_old_pb_spellings_are_mapped_with_a_note(tmp_path):
    (tmp_path / "config_eval").mkdir()
    (tmp_path / "config_eval" / "default.yaml").write_text(
        "eval_metric_for_best_epoch: precision_at_1\neval_batch_size: 64\n"
    )
    (tmp_path / "config_general").mkdir()
    (tmp_path / "config_general" / "default.yaml").write_text(
        "trainer: {MetricLossOnly: {dataloader_num_workers: 0}}\niterations_per_epoch: 7\nbatch_size: 16\n"
    )
    notes = []
    cfg, _ = load_config(str(tmp_path), log=notes.append)
    assert cfg["hook_container"] == {"HookContainer": {"primary_metric": "precision_at_1"}}
    assert cfg["tester"] == {"GlobalEmbeddingSpaceTester": {"batch_size": 64}}
    assert cfg["trainer"] == {
        "MetricLossOnly": {"dataloader_num_workers": 0, "iterations_per_epoch": 7, "batch_size": 16}
    }
    assert len(notes) == 4 and all("pre-0.9.29" in n for n in notes)


def test_old_spelling_without_counterpart_is_refused(tmp_path):
    (tmp_path / "config_general").mkdir()
    (tmp_path / "config_general" / "default.yaml").write_text("training_method: MetricLossOnly\n")
    with pytest.raises(ConfigError, match="training_method: PB's pre-0.9.29 name"):
        load_config(str(tmp_path))


def test_flat_form_is_read_by_the_one_loader(tmp_path):
    (tmp_path / "config_general.yaml").write_text(
        "seed: 0\nloss_funcs: {metric_loss: {XMLWrapper: {loss: {ContrastiveLoss: {}}}}}\n"
        "variants:\n  xml: {}\n  gap: {loss_funcs: {metric_loss~OVERRIDE~: {ContrastiveLoss: {}}}}\n"
    )
    (tmp_path / "config_models.yaml").write_text("models: {trunk: {Linear: [2, 2]}}\n")
    cfg, src = load_config(str(tmp_path), check=False)
    assert cfg["protocol"] == "paired" and src["models"].endswith("config_models.yaml")
    variants = variant_configs(cfg)
    assert variants["gap"]["loss_funcs"] == {"metric_loss": {"ContrastiveLoss": {}}}
    assert variants["xml"]["loss_funcs"]["metric_loss"]["XMLWrapper"] == {"loss": {"ContrastiveLoss": {}}}
    with pytest.raises(ConfigError, match="unknown 'nope'; this config has xml, gap"):
        variant_configs(cfg, ["nope"])


def test_messages_show_no_install_path():
    with pytest.raises(ConfigError) as e:
        load_config(find_config("contrastive"), {"config_general": ["default", "nothing"]})
    assert str(e.value).startswith(os.path.join("configs", "contrastive", "config_general", "nothing.yaml"))


def test_nested_markers_in_files(tmp_path):
    (tmp_path / "config_eval").mkdir()
    (tmp_path / "config_eval" / "default.yaml").write_text(
        "tester: {GlobalEmbeddingSpaceTester: {batch_size: 32, accuracy_calculator: "
        "{AccuracyCalculator: {k: max_bin_count}}}}\n"
    )
    (tmp_path / "config_eval" / "chunked.yaml").write_text(
        "tester~APPLY~2:\n  accuracy_calculator~OVERRIDE~:\n    ChunkedAccuracyCalculator: {chunk_size: 64}\n"
    )
    cfg, _ = load_config(str(tmp_path), {"config_eval": ["default", "chunked"]})
    assert cfg["tester"] == {
        "GlobalEmbeddingSpaceTester": {
            "batch_size": 32,
            "accuracy_calculator": {"ChunkedAccuracyCalculator": {"chunk_size": 64}},
        }
    }
