"""benchmarks/xml_cached.py: the paired statistics and the verdict wording on hand-made numbers, the parts' configs."""

import importlib.util
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    spec = importlib.util.spec_from_file_location("xml_cached", os.path.join(ROOT, "benchmarks", "xml_cached.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paired_difference_and_verdicts():
    xc = _module()
    # differences 1, 2, 6: mean 3, sd sqrt(7), t_{0.975, 2} = 4.302652729911275
    d = xc.paired({"0": 11.0, "1": 12.0, "2": 16.0, "9": 1.0}, {"0": 10.0, "1": 10.0, "2": 10.0})
    half = 4.302652729911275 * math.sqrt(7.0) / math.sqrt(3.0)
    assert d["n"] == 3 and d["wins"] == 3 and d["mean"] == 3.0
    assert d["ci95"] == pytest.approx([3.0 - half, 3.0 + half], abs=1e-9)
    assert d["sd"] == pytest.approx(math.sqrt(7.0), abs=1e-12)
    assert xc.claim({"ci95": [0.2, 1.1]}, 1.0) == "reproduced: XML higher by 0.20 to 1.10 points"
    assert xc.claim({"ci95": [-0.9, -0.1]}, 1.0) == "contradicted: XML lower by 0.10 to 0.90 points"
    assert xc.claim({"ci95": [-0.3, 0.5]}, 0.6) == "no effect larger than 0.50 points"
    assert xc.claim({"ci95": [-1.5, 0.5]}, 0.6) == "no effect larger than 1.50 points (half-width 1.00 > target 0.6)"


def test_each_part_runs_its_variants_with_the_untrained_row_and_the_shared_cache():
    xc = _module()
    config, _, folder = xc.part_config("clipart_last", "runs/x", seeds=[0, 1])
    assert list(config["variants"]) == xc.PARTS["clipart_last"][1]
    assert config["protocol"] == "benchmarks.protocols.xml_paper"  # results.json gets the xml_loss summaries
    assert config["seeds"] == [0, 1] and config["untrained"] is True
    assert config["experiment_name"] == "xml_cached_clipart_last" and folder == os.path.join(
        "runs/x", config["experiment_name"]
    )
    assert config["feature_cache"]["folder"] == os.path.abspath("runs/x/feature_cache_clipart")
    assert ["contrastive_gap_last", "untrained"] in config["comparisons"]
    assert all(set(p) <= set(config["variants"]) | {"untrained"} for p in config["comparisons"])
    glyphs, _, _ = xc.part_config("glyphs", "runs/x")
    assert len(glyphs["seeds"]) == 20 and glyphs["feature_cache"]["folder"].endswith("feature_cache_glyphs")


def test_the_probe_caption_names_each_parts_split_count_when_they_differ():
    xc = _module()
    assert xc._splits({"a": 20, "b": 20}) == "20"
    assert xc._splits({"Open Clip Art (frozen)": 4, "glyphs": 20}) == "Open Clip Art (frozen) 4, glyphs 20"
