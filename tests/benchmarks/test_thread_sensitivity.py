"""benchmarks/thread_sensitivity.py: two finished job folders compared number by number, verdicts included."""

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("ts", os.path.join(ROOT, "benchmarks", "thread_sensitivity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _job(folder, threads, xml, gap):
    """A finished job folder: results.json of two variants over 3 seeds and its environment.json."""
    from pml_extensions.runner.outputs.results import summarize

    per_seed = {
        "xml": {s: {"mean_average_precision_at_r": v} for s, v in enumerate(xml)},
        "gap": {s: {"mean_average_precision_at_r": v} for s, v in enumerate(gap)},
    }
    os.makedirs(folder)
    json.dump(summarize(per_seed, [("xml", "gap")]), open(os.path.join(folder, "results.json"), "w"))
    json.dump({"torch": "2.14.1", "torch_threads": threads}, open(os.path.join(folder, "environment.json"), "w"))
    return folder


def test_moves_and_verdicts(tmp_path):
    """XML − GAP read as XML's claim with δ = 0.01 (1 MAP@R point), t_{0.975, 2} = 4.3027, p = 1 − t / √(t² + 2):
    run a 0.10, 0.11, 0.11 (mean 0.1067, sd 0.00577, t = 32.0, p 0.00098, interval [0.0923, 0.1210]) and run b
    0.10, 0.11, 0.13 (mean 0.1133, sd 0.0153, t = 12.85, p 0.0060, interval [0.0754, 0.1513]): both exclude 0 with
    p < 0.05 (one claim: no Holm) and reach δ -> shown; run c 0.10, -0.01, 0.11 (mean 0.0667, sd 0.0666, interval
    [-0.099, +0.232]) contains 0 -> inconclusive."""
    ts = _module()
    a = _job(str(tmp_path / "a"), 1, [0.50, 0.52, 0.51], [0.40, 0.41, 0.40])  # xml above gap on every seed
    b = _job(str(tmp_path / "b"), 2, [0.50, 0.52, 0.53], [0.40, 0.41, 0.40])  # seed 2 moved by 0.02
    out = ts.compare([a, b])
    assert out["threads"] == [1, 2]
    assert out["max_move_per_seed"] == pytest.approx(0.02, abs=1e-12)
    assert out["max_move_mean"] == pytest.approx(0.02 / 3, abs=1e-12)
    (c,) = out["comparisons"]
    assert (
        c["comparison"] == "xml − gap" and c["claim"] == "greater" and c["same_verdict"] and out["verdicts_unchanged"]
    )
    assert c["verdicts"] == ["shown", "shown"]
    assert c["ci95"][0] == pytest.approx([0.10667 - 0.01434, 0.10667 + 0.01434], abs=1e-4)
    assert "| xml − gap | greater | +0.1067, +0.1133 |" in ts.markdown(out)
    flipped = _job(str(tmp_path / "c"), 2, [0.50, 0.40, 0.51], [0.40, 0.41, 0.40])  # one seed now loses
    out = ts.compare([a, flipped])
    assert out["comparisons"][0]["verdicts"] == ["shown", "inconclusive (3 seeds)"]
    assert not out["verdicts_unchanged"] and "change" in ts.markdown(out)
    # --from-json: the stored per-seed values give the same comparisons and verdicts again
    assert ts.rerender(json.loads(json.dumps(out))) == json.loads(json.dumps(out))


def test_the_lambda0_twin_is_the_pairing_check():
    ts = _module()
    assert ts.claim("contrastive_xml_lambda0", "contrastive_gap") == "on_par"
    assert ts.claim("contrastive_xml", "contrastive_xml_lambda0") == "greater"
