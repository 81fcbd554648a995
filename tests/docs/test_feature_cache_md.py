"""docs/feature_cache.md: its Python example runs as written (ImageNet MobileNetV2 on the glyphs, CPU), its config
example is a valid feature_cache key of the protocols the page names, and its commands run the config they name."""

import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = open(os.path.join(ROOT, "docs", "feature_cache.md"), encoding="utf-8").read()


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", PAGE, flags=re.S)


def test_the_config_example_is_a_valid_key():
    from benchmarks.protocols.template_block import PROTOCOL as TemplateBlock
    from pml_extensions.runner.objects.feature_cache import DEFAULTS, cache_spec
    from pml_extensions.runner.protocols import get_protocol

    (block,) = _blocks("yaml")
    config = yaml.safe_load(block)
    spec = cache_spec(config)
    assert spec["boundary"] == "0.17" and set(config["feature_cache"]) <= set(DEFAULTS)
    for protocol in (get_protocol("mlrc"), get_protocol("paired"), TemplateBlock):
        assert "feature_cache" in protocol.keys()
    assert "## In a config (runner: the `mlrc` and `paired` protocols, the template-block plugin)" in PAGE


def test_the_commands_name_a_config_with_a_feature_cache():
    from pml_extensions.runner.config.loader import find_config
    from pml_extensions.runner.protocols import get_protocol, load_config
    from pml_extensions.runner.protocols.paired_protocol import PairedProtocol

    (block,) = _blocks("bash")
    for line in block.splitlines():
        root = re.search(r"pml_extensions run (\S+)", line).group(1)
        config, _ = load_config(find_config(os.path.join(ROOT, root)), check=False)
        protocol = get_protocol(config["protocol"])  # paired, or its xml_paper subclass (benchmarks/configs)
        assert issubclass(protocol, PairedProtocol) and config["feature_cache"]["boundary"]


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
