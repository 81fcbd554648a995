"""runner/config/specs.py, read_yaml (issue 21, item 3): numbers as users write them are floats (YAML 1.2) in files,
on the command line and in search markers' ranges, everywhere a config is read."""

import pytest
import yaml

from pml_extensions.runner.config.loader import find_config, load_yaml, parse_command_line
from pml_extensions.runner.config.specs import read_yaml
from pml_extensions.runner.protocols import load_config


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e-3", 0.001),
        ("1E-5", 1e-05),
        (".5", 0.5),
        ("5.", 5.0),
        ("-5.", -5.0),
        ("1.0e5", 100000.0),  # YAML 1.1 needs a signed exponent
        ("+1e3", 1000.0),
        ("-2.5E+3", -2500.0),
        (".inf", float("inf")),
    ],
)
def test_yaml_12_floats(text, value):
    assert read_yaml(text) == value and isinstance(read_yaml(text), float)


@pytest.mark.parametrize(
    "text, value",
    [("10", 10), ("-3", -3), ("1_000", 1000), ("true", True), ("1e-3x", "1e-3x"), ("e3", "e3"), ("'1e-3'", "1e-3")],
)
def test_everything_else_reads_as_pyyaml_reads_it(text, value):
    assert read_yaml(text) == value and type(read_yaml(text)) is type(value)
    assert read_yaml(text) == yaml.safe_load(text)


def test_pyyaml_itself_is_left_alone():
    read_yaml("x: 1e-3")
    assert yaml.safe_load("1e-3") == "1e-3"  # the resolver is ours only, not PyYAML's SafeLoader


def test_the_readme_search_example_on_the_command_line():
    """The issue's input: `--optimizers~APPLY~3 "{lr~LOG_BAYESIAN~: [1e-5, 1e-2]}"` gave ['1e-5', '1e-2']."""
    from pml_extensions.runner.config.search_space import search_space

    cli = parse_command_line(["--optimizers~APPLY~3", "{lr~LOG_BAYESIAN~: [1e-5, 1e-2]}"])
    config, _ = load_config(find_config("contrastive"), {"config_general": ["default", "quick"]}, cli, True)
    assert config["optimizers"]["trunk_optimizer"]["RMSprop"]["lr~LOG_BAYESIAN~"] == [1e-05, 0.01]
    space = search_space(config)
    assert [(where, op, value) for _, where, op, value in space] == [
        ("optimizers.trunk_optimizer.RMSprop.lr", "LOG_BAYESIAN", [1e-05, 0.01]),
        ("optimizers.embedder_optimizer.RMSprop.lr", "LOG_BAYESIAN", [1e-05, 0.01]),
    ]


def test_a_plain_value_on_the_command_line():
    """The issue's input: `{lr: 1e-3}` reached a comparison as a string ('<=' not supported ...)."""
    cli = parse_command_line(["--optimizers~APPLY~3", "{lr: 1e-3}", "--patience", "1E0"])
    assert cli == {"optimizers~APPLY~3": {"lr": 0.001}, "patience": 1.0}


def test_in_config_files(tmp_path):
    general = tmp_path / "config_general"
    general.mkdir()
    (general / "default.yaml").write_text("a: 1e-3\nb: 1E-5\nc: .5\nd: 5.\ne: [1e-5, 1e-2]\n")
    assert load_yaml(str(general / "default.yaml")) == {"a": 0.001, "b": 1e-05, "c": 0.5, "d": 5.0, "e": [1e-05, 0.01]}


def test_a_saved_config_is_read_back_the_same_way(tmp_path):
    from pml_extensions.runner.experiment.folder import saved_config
    from pml_extensions.runner.objects.saved_models import find_run_config

    (tmp_path / "config.yaml").write_text("optimizers: {trunk_optimizer: {Adam: {lr: 1e-4}}}\n")
    assert saved_config(str(tmp_path))["optimizers"]["trunk_optimizer"]["Adam"]["lr"] == 1e-4
    assert find_run_config(str(tmp_path))[0]["optimizers"]["trunk_optimizer"]["Adam"]["lr"] == 1e-4


def test_transform_ranges_in_pb_strings():
    from pml_extensions.runner.config.specs import pb_numbers

    assert pb_numbers("0.16 1") == [0.16, 1]
    assert pb_numbers("1E-1 1") == [0.1, 1]
    assert pb_numbers("1e-3") == 0.001
