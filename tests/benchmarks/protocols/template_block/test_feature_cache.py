"""benchmarks/protocols/template_block with ``feature_cache``: the block between a fixed prefix and the trained rest,
the prefix's outputs cached; a cached run equals the uncached run with the prefix frozen (``FrozenPrefix``), variant by
variant and seed by seed; the one-line errors."""

import copy
import json
import os

import pytest

from benchmarks.protocols.template_block import load_models
from pml_extensions.datasets import CachedFeatureDataset
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import run_protocol
from tests.runner.runner_testing_utils import register_tiny

from .tb_testing import tiny_config

QUIET = dict(log=lambda *a, **k: None)
PREFIX = {"FixedConvNetBody": {"in_channels": 1, "widths": [4, 8], "seed": 5}}
REST = [
    {"Conv2d": {"in_channels": 8, "out_channels": 8, "kernel_size": 3, "padding": 1}},
    {"ReLU": {}},
    {"AdaptiveAvgPool2d": {"output_size": 1}},
    {"Flatten": {}},
]


def _config(task="classification"):
    register_tiny()  # FixedConvNetBody: weights from its own seed (a stand-in for pretrained weights)
    config, sources = tiny_config(variants=("baseline", "block", "aux_only"), seeds=(0, 1))
    # the eval cache holds every image of the dataset: 8 per class (the split's 6 + 2), not Fashion-MNIST's 60000
    config["dataset"]["FashionMNIST"]["max_per_class"] = 8
    config["models"] = {"trunk": {"Sequential": [PREFIX, *REST]}, "classifier": {"Linear": {}}}
    config["variants"]["block"]["template_block"]["after"] = "0"  # right after the prefix: the first trained module
    config["variants"]["aux_only"]["template_block"]["after"] = "0"
    config["comparisons"] = [["block", "baseline"], ["aux_only", "baseline"]]
    if task == "metric_learning":
        config.update(
            task="metric_learning",
            dataset={"FashionMNIST": {"class_disjoint": True, "max_per_class": 8}},
            test_dataset=None,
            split=None,
            validation={"class_fraction": 0.4, "seed": 0},
            loss_funcs={"metric_loss": {"ContrastiveLoss": {}}},
            sampler={"MPerClassSampler": {"m": 4}},
            optimizers={"trunk_optimizer": {"Adam": {"lr": 0.01}}},
            lr_schedulers=None,
            tester={"GlobalEmbeddingSpaceTester": {"batch_size": 16, "dataloader_num_workers": 0}},
            accuracy_calculator={"AccuracyCalculator": {"include": ["mean_average_precision_at_r"], "k": None}},
        )
        config["models"].pop("classifier")
        config["seeds"] = [0]
    return config, sources


def _frozen(config):
    """The uncached reference: the same trunk with its prefix wrapped in FrozenPrefix (eval mode, no gradients)."""
    plain = copy.deepcopy(config)
    plain["models"]["trunk"] = {"Sequential": [{"FrozenPrefix": {"prefix": PREFIX}}, *REST]}
    return plain


def _numbers(r):
    return {name: v["per_seed"] for name, v in r["variants"].items()}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["classification", "metric_learning"])
def test_cached_run_equals_the_uncached_run_with_the_prefix_frozen(tmp_path, task):
    config, sources = _config(task)
    plain = run_protocol(_frozen(config), str(tmp_path / "plain"), sources, **QUIET)
    cached_config = dict(config, feature_cache={"boundary": "0", "num_views": 2, "dtype": "float32"})
    cached = run_protocol(cached_config, str(tmp_path / "cached"), sources, **QUIET)
    a, b = _numbers(plain), _numbers(cached)
    assert list(a) == list(b) == ["baseline", "block", "aux_only"]
    for name in a:
        for seed in a[name]:
            assert b[name][seed]["best_iteration"] == a[name][seed]["best_iteration"], (name, seed)
            for key, value in a[name][seed].items():
                assert b[name][seed][key] == pytest.approx(value, abs=1e-5), (name, seed, key)
    # the counts of the cached models leave out the frozen prefix (it is not a model of the run any more)
    from tests.runner.runner_testing_utils import FixedConvNetBody

    prefix = sum(p.numel() for p in FixedConvNetBody(**PREFIX["FixedConvNetBody"]).parameters())
    assert {n: plain["params"][n] - c for n, c in cached["params"].items()} == dict.fromkeys(a, prefix)
    assert cached["params"]["block"] > cached["params"]["aux_only"] > cached["params"]["baseline"]
    folder = tmp_path / "cached" / "feature_cache" / "0"
    parts = ["eval", "eval.lock", "test", "test.lock", "train", "train.lock"]
    assert sorted(os.listdir(folder)) == (parts if task == "classification" else parts)
    meta = json.load(open(folder / "train" / "meta.json"))
    assert meta["num_views"] == 2 and meta["num_items"] == cached["sizes"]["train"]
    models, views = load_models(str(tmp_path / "cached"), "block", seed=0)
    assert isinstance(views["train"], CachedFeatureDataset) and views["train"].feature_shape[0] == 8
    assert [type(m).__name__ for m in models["trunk"].children()][:2] == ["TemplateMatchingBlock", "Conv2d"]


def test_block_in_the_frozen_prefix_is_one_config_error(tmp_path):
    config, sources = _config()
    config = dict(config, feature_cache={"boundary": "1", "num_views": 1, "dtype": "float32"})
    config["models"]["trunk"] = {"Sequential": [PREFIX, {"Identity": {}}, *REST]}
    config["seeds"] = [0]
    with pytest.raises(ConfigError, match=r"template_block: after: '0' puts the block in the frozen prefix") as e:
        run_protocol(config, str(tmp_path / "x"), sources, **QUIET)
    assert "\n" not in str(e.value)


def test_random_prefix_and_soft_maximizer_are_refused(tmp_path):
    config, sources = _config()
    random = dict(config, feature_cache={"boundary": "0"})
    random["models"] = dict(config["models"], trunk={"Sequential": [{"ConvNetBody": PREFIX["FixedConvNetBody"]}]})
    random["models"]["trunk"]["Sequential"][0]["ConvNetBody"] = {"in_channels": 1, "widths": [4, 8]}
    random["models"]["trunk"]["Sequential"] += REST
    with pytest.raises(ConfigError, match=r"feature_cache: the frozen prefix of models.trunk changes with the seed"):
        run_protocol(random, str(tmp_path / "a"), sources, **QUIET)
    soft = dict(config, feature_cache={"boundary": "0"})
    soft["variants"] = dict(
        config["variants"], block={"soft_maximizer": {"mixing": "softmax", "estimate_from": "baseline"}}
    )
    with pytest.raises(ConfigError, match=r"soft_maximizer: not with feature_cache"):
        run_protocol(soft, str(tmp_path / "b"), sources, **QUIET)
    bad = dict(config, feature_cache={"boundary": "0", "num_view": 2})
    with pytest.raises(ConfigError, match=r"feature_cache.num_view: no such key"):
        run_protocol(bad, str(tmp_path / "c"), sources, **QUIET)
