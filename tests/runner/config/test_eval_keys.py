"""runner/config/pb_keys.py: PB's tester, aggregator and ensemble keys, honoured or refused by name."""

import pytest

from pml_extensions.runner.config import pb_keys
from pml_extensions.runner.errors import ConfigError


def test_unknown_tester_class():
    with pytest.raises(ConfigError, match="unknown tester class 'GlobalEmbedingSpaceTester'; did you mean"):
        pb_keys.tester_spec({"tester": {"GlobalEmbedingSpaceTester": {}}})


def test_aggregator_is_the_mean_over_folds():
    folds = [{"precision_at_1": 0.5, "r_precision": 0.25}, {"precision_at_1": 0.75, "r_precision": 0.5}]
    assert pb_keys.aggregate({"aggregator": {"MeanAggregator": {"split_to_aggregate": "val"}}}, folds) == {
        "precision_at_1": 0.625,
        "r_precision": 0.375,
    }
    with pytest.raises(ConfigError, match="split_to_aggregate: only val"):
        pb_keys.aggregate({"aggregator": {"MeanAggregator": {"split_to_aggregate": "test"}}}, folds)
    with pytest.raises(ConfigError, match="unknown class 'MaxAggregator'"):
        pb_keys.aggregate({"aggregator": {"MaxAggregator": {}}}, folds)


def test_ensemble_settings():
    assert pb_keys.ensemble_settings({}) == {"normalize_embeddings": True, "use_trunk_output": False}
    cfg = {"ensemble": {"ConcatenateEmbeddings": {"normalize_embeddings": False}}}
    assert pb_keys.ensemble_settings(cfg)["normalize_embeddings"] is False
    with pytest.raises(ConfigError, match="unknown class 'Average'"):
        pb_keys.ensemble_settings({"ensemble": {"Average": {}}})
