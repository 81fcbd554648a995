"""runner/protocols/template_block/settings.py: every bad setting is one line naming the file and the key."""

import pytest

from benchmarks.protocols.template_block.settings import check_seeds, settings
from pml_extensions.runner.errors import ConfigError

BASE = {
    "dataset": {"FashionMNIST": {}},
    "models": {"trunk": {"SmallResNet": {}}, "classifier": {"Linear": {}}},
    "loss_funcs": {"classifier_loss": {"CrossEntropyLoss": {}}},
    "optimizers": {"trunk_optimizer": {"Adam": {}}},
    "num_epochs": 2,
    "iterations_per_epoch": 3,
    "batch_size": 8,
}
SRC = {"variants": "general.yaml", "seeds": "general.yaml", "comparisons": "general.yaml"}


def _settings(**changes):
    return settings({**BASE, **changes}, SRC)


def test_variants_merge_and_comparisons():
    s = _settings(
        variants={"baseline": {}, "block": {"template_block": {"aux_weight": 0.25}}},
        comparisons=[["block", "baseline"]],
        seeds="0 1",
    )
    assert s["seeds"] == [0, 1] and s["comparisons"] == [("block", "baseline")]
    assert s["variants"]["block"]["template_block"] == {"aux_weight": 0.25}
    assert s["variants"]["baseline"].get("template_block") is None and s["task"] == "classification"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"variants": {"a": {"task": "detection"}}}, r"^general.yaml \(variants.a\): task: unknown 'detection'"),
        ({"variants": {"a": {"models~OVERRIDE~": {"trunk": {"SmallResNet": {}}}}}}, r"needs models.classifier"),
        ({"variants": {"a": {"template_block": {"aux_weight": 1.5}}}}, r"template_block.aux_weight: .* \[0, 1\]"),
        ({"variants": {"a": {"num_epochs": 0}}}, r"\(variants.a\): num_epochs: must be a positive integer, got 0"),
        ({"variants": {"a": {"batch_size": None}}}, r"missing key 'batch_size'"),
        ({"variants": {"a": {}}, "comparisons": [["a", "b"]]}, r"^general.yaml: comparisons: each entry"),
        (
            {"variants": {"a": {"match_parameters": {"variant": "nope", "widen": "models.trunk"}}}},
            r"match_parameters: expected \{variant: <one of a>",
        ),
        (
            {"variants": {"a": {"match_parameters": {"variant": "a"}}}},
            r"give one of widen or deepen",
        ),
        (
            {"variants": {"s": {"soft_maximizer": {"mixing": "softmax", "estimate_from": ["b"]}}, "b": {}}},
            r"\(variants.s\): soft_maximizer.estimate_from: 'b' must be a BN-ReLU variant listed before 's'",
        ),
        (
            {"variants": {"s": {"soft_maximizer": {"mixing": "softmax", "estimate_from": "x"}}}},
            r"soft_maximizer.estimate_from: name the trained BN-ReLU variants",
        ),
        ({"variants": {"s": {"soft_maximizer": {"mixing": "argmax"}}}}, r"soft_maximizer: expected \{mixing"),
        ({"seeds": [0, 0]}, r"^general.yaml: seeds: must be distinct"),
    ],
)
def test_errors_name_the_file_and_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        _settings(**changes)


def test_check_seeds():
    assert check_seeds("3, 4") == [3, 4]
    with pytest.raises(ConfigError, match="non-negative"):
        check_seeds([-1])
