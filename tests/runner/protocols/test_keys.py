"""runner/protocols: the top-level keys a protocol reads are its settings' fields; every other key is one line
naming the nearest, or the protocol that reads it."""

import dataclasses

import pytest

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import check_keys, get_protocol
from pml_extensions.runner.protocols.base import REQUIRED, read_settings, seed_list, setting

PAIRED, MLRC = get_protocol("paired"), get_protocol("mlrc")


def test_each_protocol_reads_its_keys_and_its_old_spellings():
    check_keys({"protocol": "paired", "num_epochs": 1, "dataset_root": "/d"}, {}, PAIRED)
    check_keys({"num_epochs_train": 1, "eval_batch_size": 8}, {}, MLRC)  # PB's old spelling is mapped later
    assert "split_manager" in MLRC.keys() and "eval_batch_size" in MLRC.keys()


@pytest.mark.parametrize(
    "protocol, config, sources, message",
    [
        (
            PAIRED,
            {"num_epoch": 1},
            {"num_epoch": "config_general.yaml"},
            "^config_general.yaml: num_epoch: the paired protocol reads no such key; did you mean num_epochs[?]$",
        ),
        (
            MLRC,
            {"bogus_key": 1},
            {"bogus_key": "command line"},
            "^command line: --bogus_key: no config file defines this key and the mlrc protocol does not read it",
        ),
        (  # a key of another protocol names that protocol, not an unrelated "nearest" key ("optimizers" was)
            MLRC,
            {"selection": "last"},
            {"selection": "command line"},
            "^command line: --selection: no config file defines this key and the mlrc protocol does not "
            "read it; it is a key of the paired protocol [(]all keys: the same command with --dry-run[)]$",
        ),
        (
            PAIRED,
            {"eval_batch_size": 1},  # an old PB spelling of the mlrc protocol is unknown to another
            {"eval_batch_size": "f.yaml"},
            "^f.yaml: eval_batch_size: the paired protocol reads no such key; did you mean batch_size[?] It is a key "
            "of the mlrc protocol$",
        ),
    ],
)
def test_unknown_keys_are_one_line(protocol, config, sources, message):
    with pytest.raises(ConfigError, match=message) as e:
        check_keys(config, sources, protocol)
    assert "\n" not in str(e.value)


def test_an_unknown_protocol_is_one_line_with_the_nearest_name():
    with pytest.raises(ConfigError, match=r"^general.yaml: protocol: unknown 'pared'; did you mean paired\?"):
        get_protocol("pared", "general.yaml: protocol")


def test_settings_are_read_from_the_dataclass_with_one_line_per_bad_value():
    @dataclasses.dataclass
    class Settings:
        num_epochs: int = setting(REQUIRED, "epochs", "int", minimum=1)
        rate: float = setting(0.5, "a rate", "float", minimum=0, maximum=1)
        mode: str = setting("a", "a mode", "choice", choices=("a", "b"))
        flag: bool = setting(False, "a flag", "bool")
        pairs: list = setting([], "pairs", "name_pairs")

    s = read_settings(Settings, {"num_epochs": 2, "pairs": [["x", "y"]]}, {})
    assert (s.num_epochs, s.rate, s.mode, s.flag, s.pairs) == (2, 0.5, "a", False, [("x", "y")])
    src = {"num_epochs": "g.yaml", "rate": "g.yaml", "mode": "command line", "flag": "g.yaml", "pairs": "g.yaml"}
    cases = [
        ({}, "^g.yaml: missing key 'num_epochs'$"),
        (
            {"num_epoch": 2},
            r"^g.yaml: num_epoch: missing key 'num_epochs' \(the config has 'num_epoch': a misspelling\?\)$",
        ),
        ({"num_epochs": True}, "^g.yaml: num_epochs: expected an integer >= 1, got True$"),
        ({"num_epochs": 1, "rate": 2}, "^g.yaml: rate: expected a number >= 0 and <= 1, got 2$"),
        ({"num_epochs": 1, "mode": "c"}, "^command line: mode: expected one of a, b, got 'c'$"),
        ({"num_epochs": 1, "flag": "yes"}, "^g.yaml: flag: expected true or false, got 'yes'$"),
        ({"num_epochs": 1, "pairs": [["x"]]}, r"^g.yaml: pairs: expected a list of \[variant, baseline\] pairs"),
    ]
    for config, message in cases:
        with pytest.raises(ConfigError, match=message):
            read_settings(Settings, config, src)


def test_seed_list():
    assert seed_list("0 1 2") == [0, 1, 2] and seed_list("3,4") == [3, 4] and seed_list(5) == [5]
    for bad in ("0 x", True, [1, 1], [], [-1]):
        with pytest.raises(ConfigError, match="^seeds: expected"):
            seed_list(bad)


def test_the_config_floor_and_the_command_line_hold_no_protocol_names():
    """They ask the plugin (its keys, its --data_folder rule, its description): no protocol's name appears in a
    string of runner/config/ or cli/ (the shipped configs' names are not protocols)."""
    import ast
    import os
    import re

    import pml_extensions
    from pml_extensions.runner.config.loader import shipped_configs
    from pml_extensions.runner.protocols import PROTOCOLS

    pkg = os.path.dirname(pml_extensions.__file__)
    names = set(PROTOCOLS) | {"xml_vs_gap", "template_block", "localization", "resolution_distillation"}
    names -= set(shipped_configs())
    found = []
    for folder in ("runner/config", "cli"):
        for file in sorted(os.listdir(os.path.join(pkg, folder))):
            if not file.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(pkg, folder, file), encoding="utf-8").read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    words = set(re.findall(r"[A-Za-z_]+", node.value))
                    found += [f"{folder}/{file}:{node.lineno}: {n}" for n in names & words]
    assert found == []


def test_misspelt_required_and_parse_columns():
    """(the examples that were in the docstrings of runner/protocols/base.py)"""
    import dataclasses

    from pml_extensions.runner.protocols.base import misspelt_required, parse_columns

    @dataclasses.dataclass
    class Settings:
        num_epochs: int = setting(REQUIRED, "Epochs.", "int")

    assert misspelt_required(Settings, {"num_epoch": 4}) == {"num_epoch": "num_epochs"}
    assert parse_columns("label=category, path=image,split=subset") == {
        "label": "category",
        "path": "image",
        "split": "subset",
    }
