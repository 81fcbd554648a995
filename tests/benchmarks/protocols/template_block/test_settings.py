"""benchmarks/protocols/template_block/settings.py (and the protocol's Settings, read through the paired engine):
every bad setting is one line naming the file and the key."""

import pytest

from benchmarks.protocols.template_block import TemplateBlock
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
    """The checks the loader runs (:meth:`TemplateBlock.check`), then the grid and every variant's config."""
    config = {**BASE, **changes}
    TemplateBlock.check(config, SRC)
    configs, settings, _ = TemplateBlock.variants(config, SRC)
    return TemplateBlock.read(config, SRC), configs, settings


def test_variants_merge_and_comparisons():
    grid, configs, settings = _settings(
        variants={"baseline": {}, "block": {"template_block": {"aux_weight": 0.25}}},
        comparisons=[["block", "baseline"]],
        seeds="0 1",
    )
    assert grid.seeds == [0, 1] and grid.comparisons == [("block", "baseline")]
    assert configs["block"]["template_block"] == {"aux_weight": 0.25}
    assert configs["baseline"].get("template_block") is None and settings["baseline"].task == "classification"


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"variants": {"a": {"task": "detection"}}},
            r"^general.yaml \(variants.a\): task: expected one of classification, metric_learning, got 'detection'",
        ),
        ({"variants": {"a": {"models~OVERRIDE~": {"trunk": {"SmallResNet": {}}}}}}, r"needs models.classifier"),
        ({"variants": {"a": {"template_block": {"aux_weight": 1.5}}}}, r"template_block.aux_weight: .* \[0, 1\]"),
        ({"variants": {"a": {"num_epochs": 0}}}, r"\(variants.a\): num_epochs: expected an integer >= 1, got 0"),
        ({"variants": {"a": {"batch_size": None}}}, r"\(variants.a\): missing key 'batch_size'"),
        (
            {"variants": {"a": {}}, "comparisons": [["a", "b"]]},
            r"^general.yaml: comparisons: \['a', 'b'\] names an unknown variant; choose from a",
        ),
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
        ({"seeds": [0, 0]}, r"^general.yaml: seeds: expected distinct seeds"),
    ],
)
def test_errors_name_the_file_and_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        _settings(**changes)


def test_seeds():
    assert _settings(seeds="3, 4")[0].seeds == [3, 4]
    with pytest.raises(ConfigError, match="non-negative"):
        _settings(seeds=[-1])
