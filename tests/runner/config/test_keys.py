"""runner/config/keys.py: which top-level keys each protocol reads; every other key is one line naming the nearest."""

import pytest

from pml_extensions.runner.config.keys import PROTOCOL_KEYS, check_keys, known_keys, seed_list
from pml_extensions.runner.errors import ConfigError


def test_each_protocol_reads_its_keys_and_its_old_spellings():
    check_keys({"protocol": "xml_vs_gap", "num_epochs": 1, "dataset_root": "/d"}, {})
    check_keys({"num_epochs_train": 1, "eval_batch_size": 8}, {})  # mlrc by default; PB's old spelling is mapped later
    check_keys({"protocol": "resolution_distillation", "teacher_iterations": 1, "resolution_job": {}}, {})
    assert known_keys({})[0] == "mlrc" and "split_manager" in known_keys({})[1]


@pytest.mark.parametrize(
    "config, sources, message",
    [
        (
            {"protocol": "xml_vs_gap", "num_epoch": 1},
            {"num_epoch": "config_general.yaml"},
            "^config_general.yaml: num_epoch: the xml_vs_gap protocol reads no such key; did you mean num_epochs[?]$",
        ),
        (
            {"protocol": "resolution_distillation", "student_iteration": 1},
            {"student_iteration": "general.yaml"},
            "the resolution_distillation protocol reads no such key; did you mean student_iterations",
        ),
        (
            {"bogus_key": 1},
            {"bogus_key": "command line"},
            "^command line: --bogus_key: no config file defines this key and the mlrc protocol does not read it",
        ),
        (  # a key of another protocol names that protocol, not an unrelated "nearest" key ("optimizers" was)
            {"protocol": "xml_vs_gap", "skip_bad_images": True},
            {"skip_bad_images": "command line"},
            "^command line: --skip_bad_images: no config file defines this key and the xml_vs_gap protocol does not "
            "read it; it is a key of the mlrc protocol [(]all keys: run CONFIG --dry-run[)]$",
        ),
        (
            {"protocol": "xml_vs_gap", "test_dataset": {}},
            {"test_dataset": "config_dataset.yaml"},
            "^config_dataset.yaml: test_dataset: the xml_vs_gap protocol reads no such key; did you mean dataset[?] It "
            "is a key of the template_block and localization protocols$",
        ),
        (
            {"protocol": "mlrc", "eval_batch_size": 1},  # an old PB spelling of another protocol is still unknown
            {"eval_batch_size": "f.yaml"},
            None,
        ),
    ],
)
def test_unknown_keys_are_one_line(config, sources, message):
    if message is None:
        check_keys(config, sources)
        with pytest.raises(ConfigError, match="xml_vs_gap protocol reads no such key"):
            check_keys(dict(config, protocol="xml_vs_gap"), sources)
        return
    with pytest.raises(ConfigError, match=message) as e:
        check_keys(config, sources)
    assert "\n" not in str(e.value)


def test_an_unknown_protocol_is_left_to_the_protocol_table():
    check_keys({"protocol": "nope", "anything": 1}, {})  # protocols.protocol_name() reports it


def test_the_protocols_take_their_keys_from_the_table():
    from pml_extensions.runner.protocols.resolution_distillation import protocol as resolution
    from pml_extensions.runner.protocols.resolution_distillation.settings import JOB_DEFAULTS
    from pml_extensions.runner.protocols.xml_vs_gap import protocol as xml_vs_gap

    assert xml_vs_gap.CONFIG_KEYS is PROTOCOL_KEYS["xml_vs_gap"]
    assert resolution.CONFIG_KEYS is PROTOCOL_KEYS["resolution_distillation"]
    assert set(PROTOCOL_KEYS["resolution_distillation"]) == set(JOB_DEFAULTS) | {"protocol"}


def test_seed_list():
    assert seed_list("0 1 2") == [0, 1, 2] and seed_list("3,4") == [3, 4] and seed_list(5) == [5]
    assert seed_list("0 x") == "0 x" and seed_list([1]) == [1] and seed_list(True) is True
