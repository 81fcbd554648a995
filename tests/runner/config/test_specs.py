"""runner/config/specs.py: the one {ClassName: kwargs} parser, which the PB keys and the Builder both use."""

import pytest

from pml_extensions.runner.config import pb_keys
from pml_extensions.runner.config.specs import is_object_spec, one_spec, pb_numbers
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.builder import Builder


def test_one_spec_takes_a_spec_apart():
    assert one_spec({"MetricLossOnly": {"batch_size": 8}}, "f.yaml: trainer") == ("MetricLossOnly", {"batch_size": 8})
    assert one_spec({"MetricLossOnly": None}, "w") == ("MetricLossOnly", {})
    assert one_spec(None, "w", default="MeanAggregator") == ("MeanAggregator", {})


@pytest.mark.parametrize(
    "spec, message",
    [
        (None, r"^f.yaml: trainer: missing$"),
        ({"A": {}, "B": {}}, r"^f.yaml: trainer: expected \{ClassName: \{kwargs\}\}, got"),
        ({"A": [1, 2]}, r"^f.yaml: trainer.A: expected keyword arguments \(a mapping\), got \[1, 2\]$"),
        ([1], r"^f.yaml: trainer: expected \{ClassName"),
    ],
)
def test_one_spec_errors_name_the_file_and_key(spec, message):
    with pytest.raises(ConfigError, match=message):
        one_spec(spec, "f.yaml: trainer")


def test_the_pb_keys_and_the_builder_parse_alike():
    """The same bad spec gives the same message from a PB key accessor and from the Builder: one parser."""
    with pytest.raises(ConfigError) as from_keys:
        pb_keys.ensemble_settings({"ensemble": {"ConcatenateEmbeddings": 3}}, {"ensemble": "f.yaml"})
    with pytest.raises(ConfigError) as from_builder:
        Builder({"trainer": {"ConcatenateEmbeddings": 3}}, {"trainer": "f.yaml"}).build_trainer()
    assert (
        str(from_keys.value) == "f.yaml: ensemble.ConcatenateEmbeddings: expected keyword arguments (a mapping), got 3"
    )
    assert str(from_builder.value) == str(from_keys.value).replace("ensemble", "trainer", 1)


def test_object_specs_and_pb_numbers():
    assert is_object_spec({"ContrastiveLoss": {}}) and is_object_spec({"Flatten": None})
    assert not is_object_spec({"layer_sizes": [128]}) and not is_object_spec({"A": 1, "B": 2})
    assert pb_numbers("0.16 1") == [0.16, 1] and pb_numbers("3") == 3 and pb_numbers("1e-3") == 0.001
    assert pb_numbers("bilinear") == "bilinear" and pb_numbers([1, 2]) == [1, 2]
