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
    assert d["n"] == 3 and d["wins"] == 3 and d["mean_difference"] == 3.0 and "verdict" not in d
    assert d["ci95"] == pytest.approx([3.0 - half, 3.0 + half], abs=1e-9)
    assert d["std"] == pytest.approx(math.sqrt(7.0), abs=1e-12)
    # one claim, δ = 1 point: the interval contains 0 -> inconclusive
    assert xc.paired({"0": 11.0, "1": 12.0, "2": 16.0}, {"0": 10.0, "1": 10.0, "2": 10.0}, 1.0)["verdict"] == (
        "inconclusive (3 seeds)"
    )


def test_the_rows_are_one_holm_family_with_the_runners_words():
    """The runner's hand-checked claims (results.py's docstring), δ = 1 point: A 2, 2.5, 3 (t interval [1.258,
    3.742], p 0.01307); B 0.5, 1, 1.5 ([-0.242, 2.242], p 0.07418); C 0.10, 0.12, 0.14 ([0.070, 0.170], p 0.00913).
    Holm over the three: C 3 · 0.00913 = 0.0274, A max(2 · 0.01307, 0.0274) = 0.0274, B 0.0742."""
    xc = _module()
    zero = {"0": 0.0, "1": 0.0, "2": 0.0}
    ds = [xc.paired(dict(zip(zero, v)), zero, 1.0) for v in ([2, 2.5, 3], [0.5, 1, 1.5], [0.1, 0.12, 0.14])]
    assert [d["p_holm"] for d in ds] == [pytest.approx(p, abs=1e-5) for p in (0.01307, 0.07418, 0.00913)]  # 1 claim
    assert xc.claims(ds) == ["shown", "inconclusive (3 seeds)", "no effect of practical size"]
    assert [d["p_holm"] for d in ds] == [pytest.approx(p, abs=1e-4) for p in (0.0274, 0.0742, 0.0274)]
    assert ds[0]["ci95"] == pytest.approx([1.258, 3.742], abs=1e-3)
    # the mirror image of A, alone: contradicted
    minus_a = xc.paired({"0": -2.0, "1": -2.5, "2": -3.0}, zero, 1.0)
    assert xc.claims([minus_a]) == ["contradicted"]


def test_a_stored_table_is_recomputed_from_its_differences():
    """--render: a file written before the seeds and the verdict statistics were stored (old keys ``mean``, ``sd``)
    gets the same comparison as the merge, its differences read in the order the seeds were sorted as strings."""
    xc = _module()
    seeds = list(range(11))  # "0", "1", "10", "2", ...: the 11th seed is the third difference
    keys = sorted(str(s) for s in seeds)
    diffs = [2.0 + 0.1 * int(k) for k in keys]
    old = {"mean": 2.5, "ci95": [0, 1], "sd": 1.0, "n": 11, "wins": 11, "differences": diffs}
    row = {"dataset": "glyphs", "difference": old, "gap_minus_untrained": old, "target_half_width": 0.6,
           "verdict": "reproduced: XML higher by 2.03 to 2.97 points",
           "map_unseen": {"xml": 1.0, "gap": 0.0, "difference": old},
           "map_seen": {"xml": 1.0, "gap": 0.0, "difference": old}}  # fmt: skip
    out = xc.rerender({"rows": [row], "seeds": seeds})
    (new,) = out["rows"]
    assert "target_half_width" not in new and new["verdict"] == "shown"  # Δ 2.5 ≥ 1, p ≈ 1e-10
    d = new["difference"]
    assert d["seeds"] == keys and d["differences"] == diffs and d["mean_difference"] == pytest.approx(2.5)
    assert d["smallest_effect"] == 1.0 and d["claim"] == "greater" and d["p_holm"] == d["p_value"]
    assert "verdict" not in new["gap_minus_untrained"] and new["map_seen"]["difference"]["wins"] == 11
    with pytest.raises(ValueError, match="11 differences for 3 seeds"):
        xc.rerender({"rows": [row], "seeds": [0, 1, 2]})


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
