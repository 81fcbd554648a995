"""runner/config/eval_keys.py: PB's tester, aggregator and ensemble keys, honoured or refused by name."""

import pytest

from pml_extensions.runner.config import eval_keys
from pml_extensions.runner.errors import ConfigError


def test_unknown_tester_class():
    with pytest.raises(ConfigError, match="unknown tester class 'GlobalEmbedingSpaceTester'; did you mean"):
        eval_keys.tester_spec({"tester": {"GlobalEmbedingSpaceTester": {}}})


def test_aggregator_is_the_mean_over_folds():
    folds = [{"precision_at_1": 0.5, "r_precision": 0.25}, {"precision_at_1": 0.75, "r_precision": 0.5}]
    assert eval_keys.aggregate({"aggregator": {"MeanAggregator": {"split_to_aggregate": "val"}}}, folds) == {
        "precision_at_1": 0.625,
        "r_precision": 0.375,
    }
    with pytest.raises(ConfigError, match="split_to_aggregate: only val"):
        eval_keys.aggregate({"aggregator": {"MeanAggregator": {"split_to_aggregate": "test"}}}, folds)
    with pytest.raises(ConfigError, match="unknown class 'MaxAggregator'"):
        eval_keys.aggregate({"aggregator": {"MaxAggregator": {}}}, folds)


def test_ensemble_settings():
    assert eval_keys.ensemble_settings({}) == {"normalize_embeddings": True, "use_trunk_output": False}
    cfg = {"ensemble": {"ConcatenateEmbeddings": {"normalize_embeddings": False}}}
    assert eval_keys.ensemble_settings(cfg)["normalize_embeddings"] is False
    with pytest.raises(ConfigError, match="unknown class 'Average'"):
        eval_keys.ensemble_settings({"ensemble": {"Average": {}}})
