"""benchmarks/template_block_cached.py: the tasks' configs, and the merge (paired per-seed differences, 95 % CIs,
verdict words, half-widths against the target) on hand-made results.json files."""

import importlib.util
import json
import math
import os

import pytest

from pml_extensions.runner.outputs.results import summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T_975_2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom


def _module():
    path = os.path.join(ROOT, "benchmarks", "template_block_cached.py")
    spec = importlib.util.spec_from_file_location("template_block_cached", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_task_configs_share_nothing_but_the_prefix_and_keep_their_caches_apart():
    tbc = _module()
    cls, _, folder = tbc.task_config("classification", runs="runs/x")
    dml, _, dml_folder = tbc.task_config("dml", runs="runs/x", seeds=[0, 1])
    assert cls["task"] == "classification" and dml["task"] == "metric_learning"
    assert len(cls["seeds"]) >= 10 and dml["seeds"] == [0, 1]
    assert folder == os.path.join("runs/x", "template_block_cached_clipart_classification") != dml_folder
    assert cls["feature_cache"]["folder"] == os.path.abspath("runs/x/feature_cache_classification")
    assert dml["feature_cache"]["folder"] == os.path.abspath("runs/x/feature_cache_dml")
    assert dml["variants"]["deeper"]["feature_cache~OVERRIDE~"]["folder"] == dml["feature_cache"]["folder"]
    assert "classifier" in cls["models"] and "classifier" not in dml["models"] and dml["split"] is None
    assert list(cls["variants"]) == ["baseline", "block", "aux_only", "deeper"]
    assert cls["variants"]["aux_only"]["template_block"] == {"after": "0.13", "aux_weight": 0.5, "mixing": "none"}
    quick, _, _ = tbc.task_config("classification", size="quick")
    assert quick["seeds"] == [0, 1, 2] and quick["dataset"]["kwargs"] == {"max_side": 160, "max_classes": 12}


def _results(task, per_seed, params):
    metric = "accuracy" if task == "classification" else "mean_average_precision_at_r"
    rows = {name: {s: {f"test_{metric}": v} for s, v in enumerate(values)} for name, values in per_seed.items()}
    r = summarize(rows, comparisons=[], metrics=[f"test_{metric}"])
    r.update(
        task=task,
        primary_metric=metric,
        seeds=list(range(len(next(iter(per_seed.values()))))),
        params=params,
        sizes={"train": 60, "val": 20, "test": 20},
        num_classes=10,
        num_epochs=2,
        iterations_per_epoch=50,
        batch_size=32,
    )
    return r


def test_merge_pairs_by_seed_and_words_the_verdicts(tmp_path):
    tbc = _module()
    params = {"baseline": 100, "block": 130, "aux_only": 110, "deeper": 200}
    cls = _results(
        "classification",
        {
            "baseline": [50.0, 50.0, 50.0],
            "block": [51.0, 52.0, 56.0],  # block − baseline: 1, 2, 6
            "aux_only": [50.2, 50.3, 50.4],  # aux_only − baseline: 0.2, 0.3, 0.4
            "deeper": [49.0, 50.0, 51.0],
        },
        params,
    )
    dml = _results("metric_learning", {"baseline": [0.5, 0.5, 0.5], "block": [0.49, 0.50, 0.48]}, params)
    for task, r in (("classification", cls), ("dml", dml)):
        os.makedirs(tmp_path / f"template_block_cached_clipart_{task}")
        with open(tmp_path / f"template_block_cached_clipart_{task}" / "results.json", "w") as f:
            json.dump(r, f)
    out = tbc.merge(str(tmp_path))
    rows = {(c["variant"], c["baseline"]): c for c in out["tasks"]["classification"]["claims"]}
    assert list(rows) == [("block", "baseline"), ("aux_only", "baseline"), ("block", "aux_only"),
                          ("block", "deeper"), ("deeper", "baseline")]  # fmt: skip
    c = rows[("block", "baseline")]
    half = T_975_2 * math.sqrt(7.0) / math.sqrt(3.0)  # differences 1, 2, 6: mean 3, sd sqrt(7)
    assert c["difference"]["differences"] == pytest.approx([1.0, 2.0, 6.0])
    assert c["difference"]["ci95"] == pytest.approx([3.0 - half, 3.0 + half], abs=1e-9)
    assert c["half_width"] == pytest.approx(half, abs=1e-9) and c["wins"] == 3
    assert c["verdict"] == "not shown" and c["bound"] == pytest.approx(3.0 + half)
    aux = rows[("aux_only", "baseline")]  # mean 0.3, sd 0.1: [0.3 ∓ 0.248] lies above 0
    assert aux["verdict"] == "reproduced" and aux["difference"]["ci95"][0] == pytest.approx(
        0.3 - T_975_2 * 0.1 / 3**0.5
    )
    assert rows[("block", "deeper")]["difference"]["differences"] == pytest.approx([2.0, 2.0, 5.0])
    assert rows[("block", "aux_only")]["difference"]["mean_difference"] == pytest.approx(2.7)
    # MAP@R in points: differences -1, 0, -2 (× 100)
    d = out["tasks"]["dml"]["claims"][0]
    assert d["difference"]["differences"] == pytest.approx([-1.0, 0.0, -2.0])
    assert out["tasks"]["dml"]["variants"]["baseline"]["mean"] == pytest.approx(50.0)
    text = tbc.markdown(out)
    assert f"| block − baseline: {tbc.CLAIMS[0][2]} | +3.00 [{3 - half:+.2f}, {3 + half:+.2f}] | {half:.2f} |" in text
    assert f"not shown: no effect larger than {3 + half:.2f} points (half-width {half:.2f} > target 0.5)" in text
    assert "| + template-matching block after features.13 (λ = 0.5) | 53.00 ± 2.65 | 130 |" in text
    with pytest.raises(SystemExit, match="no results.json"):
        tbc.merge(str(tmp_path / "empty"))


def test_verdict_words_within_the_target():
    tbc = _module()
    claim = {"verdict": "reproduced", "half_width": 0.4, "target_half_width": 0.5, "bound": 0.9}
    assert tbc._words(claim) == "reproduced"
    assert tbc._words(dict(claim, verdict="not shown")) == "not shown: no effect larger than 0.90 points"
    assert tbc._words(dict(claim, half_width=None)) == "reproduced (1 seed)"


def test_the_quick_smoke_size_never_replaces_the_evidence_table():
    """reproduce.py --size quick merges the 12-class smoke run into its own results file; the medium run writes the
    evidence table the docs show."""
    tbc = _module()
    assert tbc.results_name("quick") == "template_block_cached_quick"
    assert tbc.results_name("medium") == "template_block_cached"
    spec = importlib.util.spec_from_file_location("reproduce_tbc", os.path.join(ROOT, "benchmarks", "reproduce.py"))
    rep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rep)
    written = {size: {n for s in rep.steps(size, "cpu", "runs") for n in s.results} for size in ("quick", "full")}
    assert "template_block_cached_quick" in written["quick"] and "template_block_cached" not in written["quick"]
    assert "template_block_cached" in written["full"]
