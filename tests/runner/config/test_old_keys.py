"""runner/config/old_keys.py: older spellings read as today's keys with one note, or refused with one line."""

import pytest

from pml_extensions.runner.config.old_keys import map_old_keys, map_resolution_job, resolution_models
from pml_extensions.runner.errors import ConfigError

OLD_JOB = {
    "datasets": {"glyphs": {"database_resolution": 32, "query_resolutions": [16]}},
    "seeds": [0, 1],
    "embedding_dim": 16,
    "device": "cpu",
}


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


def test_the_resolution_job_layout_becomes_top_level_keys():
    notes, sources = [], {"resolution_job": "general.yaml", "protocol": "general.yaml"}
    out = map_old_keys({"protocol": "resolution_distillation", "resolution_job": OLD_JOB}, sources, log=notes.append)
    assert out == {
        "protocol": "resolution_distillation",
        "datasets": OLD_JOB["datasets"],
        "seeds": [0, 1],
        "models": resolution_models(16),
        "device": "cpu",
    }
    assert out["models"]["embedder"] == {"RetrievalHead": {"in_channels": 1280, "out_dim": 16}}
    assert sources["models"] == sources["seeds"] == "general.yaml"  # later errors name the file
    assert len(notes) == 1 and "\n" not in notes[0] and notes[0].startswith("note: general.yaml: resolution_job")
    assert map_resolution_job({"resolution_job": {}})["models"] == resolution_models(512)  # the old default


def test_which_value_wins_when_a_key_is_given_twice():
    # a top-level value from the command line beats the old layout's file ...
    sources = {"resolution_job": "general.yaml", "seeds": "command line"}
    assert map_resolution_job({"resolution_job": OLD_JOB, "seeds": [7]}, sources)["seeds"] == [7]
    # ... and an old-layout value from the command line beats the new layout's file
    sources = {"resolution_job": "command line", "device": "general.yaml", "models": "general.yaml"}
    out = map_resolution_job({"resolution_job": OLD_JOB, "device": "cuda", "models": resolution_models(8)}, sources)
    assert out["device"] == "cpu" and out["models"] == resolution_models(16)
    # without sources (a dict in code) the top level wins
    assert map_resolution_job({"resolution_job": OLD_JOB, "seeds": [3]})["seeds"] == [3]


def test_bad_old_layouts_are_one_line():
    with pytest.raises(ConfigError, match="^f.yaml: resolution_job: unknown key 'seed'; did you mean 'seeds'[?]$"):
        map_resolution_job({"resolution_job": {"seed": 1}}, {"resolution_job": "f.yaml"})
    with pytest.raises(ConfigError, match="resolution_job: must be a mapping"):
        map_resolution_job({"resolution_job": [1]})
    assert map_old_keys({"protocol": "xml_vs_gap", "x": 1}, {}) == {"protocol": "xml_vs_gap", "x": 1}
