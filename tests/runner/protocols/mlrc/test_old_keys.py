"""protocols/mlrc/old_keys.py: powerful-benchmarker's older spellings read as today's keys with one note, or refused
with one line (the resolution protocol's own old `resolution_job:` layout is gone: CHANGELOG)."""

import pytest

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols.mlrc.old_keys import map_old_keys


def test_pb_pre_0929_spellings_become_object_arguments():
    notes, sources = [], {"eval_batch_size": "config_eval.yaml", "test_size": "config_dataset.yaml"}
    out = map_old_keys({"eval_batch_size": 64, "test_size": 0.25}, sources, log=notes.append)
    assert out == {
        "tester": {"GlobalEmbeddingSpaceTester": {"batch_size": 64}},
        "split_manager": {"ClassDisjointSplitManager": {"test_size": 0.25}},
    }
    assert notes == [
        "note: config_eval.yaml: eval_batch_size is powerful-benchmarker's pre-0.9.29 spelling; read as "
        "tester~APPLY~2: {batch_size: 64}",
        "note: config_dataset.yaml: test_size is powerful-benchmarker's pre-0.9.29 spelling; read as "
        "split_manager~APPLY~2: {test_size: 0.25}",
    ]
    with pytest.raises(ConfigError, match="^f.yaml: training_method: PB's pre-0.9.29 name of the trainer"):
        map_old_keys({"training_method": "x"}, {"training_method": "f.yaml"}, log=notes.append)
