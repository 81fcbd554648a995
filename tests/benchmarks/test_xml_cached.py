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


def test_per_class_data_make_the_bootstrap_resample_test_classes_and_must_reproduce_each_seed():
    """Two seeds, two test classes each; per class [sum, count] of per-query MAP@R points. Arm a: seed 0 classes
    (10 + 30) / (1 + 1) = 20, seed 1 (40 + 20) / 2 = 30; arm b: 10 and 20. Differences 10, 10."""
    xc = _module()
    pa = {"0": {"x": [10.0, 1], "y": [30.0, 1]}, "1": {"x": [40.0, 1], "y": [20.0, 1]}}
    pb = {"0": {"x": [5.0, 1], "y": [15.0, 1]}, "1": {"x": [10.0, 1], "y": [30.0, 1]}}
    d = xc.paired({"0": 20.0, "1": 30.0}, {"0": 10.0, "1": 20.0}, 1.0, "greater", (pa, pb))
    assert d["differences"] == [10.0, 10.0] and d["bootstrap"]["resampled"] == "seeds and test classes"
    assert d["bootstrap"]["n_classes"] == 2
    # the class resamples move the difference: seed 1 with class x twice is 40 - 10 = 30, with y twice -10
    lo, hi = d["bootstrap_ci95"]
    assert lo < 10.0 < hi and hi - lo > 1.0
    with pytest.raises(ValueError, match=r"seed 1 \(a\): Σ sum / Σ count 30.0 ≠ 31.0"):
        xc.paired({"0": 20.0, "1": 31.0}, {"0": 10.0, "1": 20.0}, 1.0, "greater", (pa, pb))


def test_the_trained_setting_keeps_its_configs_folder_and_cache():
    xc = _module()
    config, _, folder = xc.part_config("clipart_trained", "runs/x", seeds=[0])
    assert config["experiment_name"] == "xml_trained_clipart" and folder == os.path.join(
        "runs/x", "xml_trained_clipart"
    )
    assert config["feature_cache"]["boundary"] == "0.13" and "folder" not in config["feature_cache"]
    assert xc.SETTINGS["trained"] == ("clipart_trained", "glyphs_trained") and xc.OUTPUT["trained"] == "xml_trained"


def _run_folder(root, name, variants, seeds=("0", "1", "2"), threads=None):
    import json

    per_seed = {v: {s: {"mean_average_precision_at_r": 0.2 + 0.01 * i + 0.001 * int(s)} for s in seeds}
                for i, v in enumerate(variants)}  # fmt: skip
    results = {"variants": {v: {"per_seed": p} for v, p in per_seed.items()}, "seeds": [int(s) for s in seeds],
               "selection": {"epochs": {v: 2 for v in variants}}, "iterations_per_epoch": 50,
               "untrained": {"mean": 0.2}}  # fmt: skip
    if threads is not None:
        results["environment"] = {"torch": "2.14.1", "torch_threads": threads}
    probe = {v: {s: {"map_seen": 50.0, "map_unseen": 40.0 + i} for s in seeds} for i, v in enumerate(variants)}
    probe["splits"] = 20
    os.makedirs(root / name)
    (root / name / "results.json").write_text(json.dumps(results))
    (root / name / "probe.json").write_text(json.dumps(probe))


def test_merge_lists_the_rows_a_part_did_not_run(tmp_path):
    """The glyph part ran only the contrastive variants: its ProxyAnchor row is named under not_run, and Holm runs
    over the three rows that exist. XML − GAP: 1 point on every seed (0.01 as a fraction)."""
    xc = _module()
    five = ["untrained", "contrastive_gap", "contrastive_xml", "contrastive_xml_lambda0", "proxy_anchor_gap",
            "proxy_anchor_xml"]  # fmt: skip
    _run_folder(tmp_path, "xml_trained_clipart", five)
    _run_folder(tmp_path, "xml_trained_glyphs", five[:4])
    out = xc.merge(str(tmp_path), "trained")
    assert [(r["dataset"], r["loss"]) for r in out["rows"]] == [
        ("Open Clip Art", "contrastive"), ("Open Clip Art", "ProxyAnchor"), ("glyphs", "contrastive")]  # fmt: skip
    assert out["not_run"] == ["glyphs features.14-18 trained ProxyAnchor"]
    assert out["rows"][0]["difference"]["mean_difference"] == pytest.approx(1.0)
    assert out["rows"][0]["iterations"] == 100 and out["rows"][0]["map_unseen"]["difference"]["mean_difference"] == 1
    text = xc.markdown(out)
    assert "Not run: glyphs features.14-18 trained ProxyAnchor." in text and "over the 3 rows" in text
    import shutil

    shutil.rmtree(tmp_path / "xml_trained_glyphs")
    assert xc.merge(str(tmp_path), "trained")["not_run"] == [
        "glyphs features.14-18 trained contrastive", "glyphs features.14-18 trained ProxyAnchor"]  # fmt: skip


def test_update_replaces_the_rows_of_a_rerun_part_and_keeps_the_others(tmp_path):
    """A part rerun alone (the XML probe's GAP trunk ran in training mode): its rows replace the stored ones, the
    other parts' rows stay, and Holm runs over the whole table again."""
    import json
    import shutil

    xc = _module()
    five = ["untrained", "contrastive_gap", "contrastive_xml", "contrastive_xml_lambda0", "proxy_anchor_gap",
            "proxy_anchor_xml"]  # fmt: skip
    _run_folder(tmp_path, "xml_trained_clipart", five)
    _run_folder(tmp_path, "xml_trained_glyphs", five)
    stored = xc.merge(str(tmp_path), "trained")
    probe = tmp_path / "xml_trained_clipart" / "probe.json"
    p = json.loads(probe.read_text())
    p["contrastive_gap"] = {s: dict(v, map_unseen=30.0) for s, v in p["contrastive_gap"].items()}
    probe.write_text(json.dumps(p))
    shutil.rmtree(tmp_path / "xml_trained_glyphs")
    out = xc.update(stored, xc.merge(str(tmp_path), "trained"))
    assert [r["map_unseen"]["gap"] for r in out["rows"]] == [30.0, 44.0, 41.0, 44.0]
    assert [r["verdict"] for r in out["rows"]] == [r["verdict"] for r in stored["rows"]]
    with pytest.raises(ValueError, match="seeds"):
        xc.update(dict(stored, seeds=[0]), xc.merge(str(tmp_path), "trained"))


def test_update_adds_the_rows_of_a_part_the_stored_table_lists_as_not_run(tmp_path):
    """The glyph part finished after the Open Clip Art table was written: its two rows are appended, leave not_run,
    and Holm runs over the four rows; the stored rows are unchanged and no rerun note is written. XML − GAP is 1 point
    on every seed of every row, so each row's adjusted p is the same over 2 or 4 rows only if Holm is recomputed."""
    import shutil

    xc = _module()
    five = ["untrained", "contrastive_gap", "contrastive_xml", "contrastive_xml_lambda0", "proxy_anchor_gap",
            "proxy_anchor_xml"]  # fmt: skip
    _run_folder(tmp_path, "xml_trained_clipart", five, threads=2)
    stored = xc.merge(str(tmp_path), "trained")
    assert len(stored["rows"]) == 2 and len(stored["not_run"]) == 2
    assert stored["environment"].endswith("2 torch threads")
    shutil.rmtree(tmp_path / "xml_trained_clipart")
    _run_folder(tmp_path, "xml_trained_glyphs", five, threads=1)
    out = xc.update(stored, xc.merge(str(tmp_path), "trained"))
    # each dataset keeps the thread count it ran with
    assert (
        out["environment"].startswith("Open Clip Art: torch 2.14.1")
        and "2 torch threads; glyphs:" in out["environment"]
    )
    assert out["environment"].endswith("1 torch thread")
    again = xc.update(out, xc.merge(str(tmp_path), "trained"))  # the glyph part rerun once more: no nested lines
    assert again["environment"] == out["environment"] and again["environments"] == out["environments"]
    assert [(r["dataset"], r["loss"]) for r in out["rows"]] == [
        ("Open Clip Art", "contrastive"), ("Open Clip Art", "ProxyAnchor"), ("glyphs", "contrastive"),
        ("glyphs", "ProxyAnchor")]  # fmt: skip
    assert out["not_run"] == [] and out.get("notes", []) == []
    assert out["rows"][0]["difference"]["differences"] == stored["rows"][0]["difference"]["differences"]
    assert "Not run" not in xc.markdown(out) and "over the 4 rows" in xc.markdown(out)
    with pytest.raises(ValueError, match="no rows"):  # a row the stored table neither has nor lists as not run
        xc.update(out, xc.merge(str(tmp_path), "trained") | {"rows": [dict(out["rows"][0], loss="Triplet")]})
