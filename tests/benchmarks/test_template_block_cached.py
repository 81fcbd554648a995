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
    """Hand-made accuracies (points), δ = 0.5: block − baseline 1, 1.25, 1.5 (mean 1.25, sd 0.25, t = 8.660,
    p = 1 − t / √(t² + 2) = 0.01307); aux_only − baseline 0.05, 0.06, 0.07 (t = 10.392, p = 0.00913, interval
    [0.0352, 0.0848]); block − aux_only 0.95, 1.19, 1.43 (sd 0.24, t = 8.588, p = 0.01333); block − deeper 1.1, 1.25,
    1.4 (sd 0.15, t = 14.434, p = 0.00479); deeper − baseline -0.1, 0, 0.1 (t = 0, p = 1; interval ±0.248). Every
    difference of one sign keeps its bootstrap p at 2 / 10001, so the t-test's p is the larger. Holm over the five:
    0.00479 · 5 = 0.0240, 0.00913 · 4 = 0.0365, 0.01307 · 3 = 0.0392, max(0.01333 · 2, 0.0392) = 0.0392, 1."""
    tbc = _module()
    params = {"baseline": 100, "block": 130, "aux_only": 110, "deeper": 200}
    cls = _results(
        "classification",
        {
            "baseline": [50.0, 50.0, 50.0],
            "block": [51.0, 51.25, 51.5],
            "aux_only": [50.05, 50.06, 50.07],
            "deeper": [49.9, 50.0, 50.1],
        },
        params,
    )
    # MAP@R, δ = 1 point: block − baseline -3, -2.5, -2 points, the mirror image of the first row (p = 0.01307)
    dml = _results("metric_learning", {"baseline": [0.5, 0.5, 0.5], "block": [0.47, 0.475, 0.48]}, params)
    for task, r in (("classification", cls), ("dml", dml)):
        os.makedirs(tmp_path / f"template_block_cached_clipart_{task}")
        with open(tmp_path / f"template_block_cached_clipart_{task}" / "results.json", "w") as f:
            json.dump(r, f)
    out = tbc.merge(str(tmp_path))
    rows = {(c["variant"], c["baseline"]): c for c in out["tasks"]["classification"]["claims"]}
    assert list(rows) == [("block", "baseline"), ("aux_only", "baseline"), ("block", "aux_only"),
                          ("block", "deeper"), ("deeper", "baseline")]  # fmt: skip
    c = rows[("block", "baseline")]
    half = T_975_2 * 0.25 / math.sqrt(3.0)
    assert c["difference"]["differences"] == pytest.approx([1.0, 1.25, 1.5])
    assert c["difference"]["ci95"] == pytest.approx([1.25 - half, 1.25 + half], abs=1e-9)
    assert c["half_width"] == pytest.approx(half, abs=1e-9) and c["wins"] == 3
    p_holm = {k: r["difference"]["p_holm"] for k, r in rows.items()}
    assert [p_holm[k] for k in rows] == [pytest.approx(p, abs=2e-4) for p in (0.0392, 0.0365, 0.0392, 0.0240, 1.0)]
    assert [r["verdict"] for r in rows.values()] == [
        "shown",  # 0.629 > 0, p̃ 0.039 < 0.05, 1.25 ≥ 0.5
        "no effect of practical size",  # [0.035, 0.085] within ±0.5, although it excludes 0
        "shown",
        "shown",
        "no effect of practical size",  # [-0.248, 0.248]
    ]
    assert out["tasks"]["classification"]["smallest_effect"] == 0.5
    assert rows[("block", "deeper")]["difference"]["differences"] == pytest.approx([1.1, 1.25, 1.4])
    assert rows[("block", "aux_only")]["difference"]["mean_difference"] == pytest.approx(1.19)
    d = out["tasks"]["dml"]["claims"][0]  # MAP@R in points, one claim: p̃ = p = 0.01307, Δ = -2.5 ≤ -1
    assert d["difference"]["differences"] == pytest.approx([-3.0, -2.5, -2.0])
    assert d["verdict"] == "contradicted" and d["difference"]["p_holm"] == pytest.approx(0.01307, abs=1e-5)
    assert out["tasks"]["dml"]["variants"]["baseline"]["mean"] == pytest.approx(50.0)
    text = tbc.markdown(out)
    assert f"| block − baseline: {tbc.CLAIMS[0][2]} | +1.25 [{1.25 - half:+.2f}, {1.25 + half:+.2f}] | +1.25 [" in text
    assert "| 3/3 | 0.039 | shown |" in text and "| 0/3 | 0.013 | contradicted |" in text
    assert "δ = 0.5 accuracy points." in text and "δ = 1 MAP@R point." in text
    assert "| + template-matching block after features.13 (λ = 0.5) | 51.25 ± 0.25 | 130 |" in text
    with pytest.raises(SystemExit, match="no results.json"):
        tbc.merge(str(tmp_path / "empty"))
    # --render: the stored file gives the same claims again from its per-seed differences
    stored = json.loads(json.dumps(out))
    for c in stored["tasks"]["classification"]["claims"]:
        c["verdict"] = c["difference"]["verdict"] = "reproduced"  # words of an older vocabulary
    again = tbc.rerender(stored)
    assert again == json.loads(json.dumps(out)) and tbc.markdown(again) == text


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
