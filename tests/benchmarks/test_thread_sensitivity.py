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
    ts = _module()
    a = _job(str(tmp_path / "a"), 1, [0.50, 0.52, 0.51], [0.40, 0.41, 0.40])  # xml above gap on every seed
    b = _job(str(tmp_path / "b"), 2, [0.50, 0.52, 0.53], [0.40, 0.41, 0.40])  # seed 2 moved by 0.02
    out = ts.compare([a, b])
    assert out["threads"] == [1, 2]
    assert out["max_move_per_seed"] == pytest.approx(0.02, abs=1e-12)
    assert out["max_move_mean"] == pytest.approx(0.02 / 3, abs=1e-12)
    (c,) = out["comparisons"]
    assert c["comparison"] == "xml − gap" and c["same_verdict"] and out["verdicts_unchanged"]
    assert c["verdicts"][0].startswith("reproduced")
    flipped = _job(str(tmp_path / "c"), 2, [0.50, 0.40, 0.51], [0.40, 0.41, 0.40])  # one seed now loses
    out = ts.compare([a, flipped])
    assert not out["verdicts_unchanged"] and "change" in ts.markdown(out)
