"""docs/feature_cache.md: its Python example runs as written (ImageNet MobileNetV2 on the glyphs, CPU), and its
config example is a valid feature_cache key of the shipped configs' protocols."""

import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = open(os.path.join(ROOT, "docs", "feature_cache.md"), encoding="utf-8").read()


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", PAGE, flags=re.S)


def test_the_config_example_is_a_valid_key():
    from pml_extensions.runner.config.keys import PROTOCOL_KEYS
    from pml_extensions.runner.objects.feature_cache import DEFAULTS, cache_spec

    (block,) = _blocks("yaml")
    config = yaml.safe_load(block)
    spec = cache_spec(config)
    assert spec["boundary"] == "0.17" and set(config["feature_cache"]) <= set(DEFAULTS)
    assert all("feature_cache" in PROTOCOL_KEYS[p] for p in ("mlrc", "xml_vs_gap"))
    assert "xml_cached_glyphs" in _blocks("bash")[0]


@pytest.mark.slow
def test_the_python_example_runs_as_written(tmp_path, monkeypatch, mobilenet_weights):
    (code,) = _blocks("python")
    monkeypatch.chdir(tmp_path)  # its caches go to runs/doc_cache under the working directory
    namespace = {"__name__": "__docs__"}
    exec(compile(code, "docs/feature_cache.md", "exec"), namespace)
    accuracy = namespace["tester"].all_accuracies["test"]["mean_average_precision_at_r_level0"]
    assert 0.0 < accuracy <= 1.0
    assert namespace["train_set"].epoch == 2 and namespace["train_set"].num_views == 2
    assert sorted(os.listdir(tmp_path / "runs" / "doc_cache")) == ["test", "train"]
