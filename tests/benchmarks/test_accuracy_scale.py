"""benchmarks/accuracy_scale.py: its case syntax, its ratios (always within one run) and a tiny end-to-end run."""

import importlib.util
import json
import os
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "accuracy_scale.py")
_spec = importlib.util.spec_from_file_location("accuracy_scale", SCRIPT)
accuracy_scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(accuracy_scale)


def test_cases():
    assert accuracy_scale.parse_case("100000:1000") == (100000, 1000, False)
    assert accuracy_scale.parse_case("100000:1000:q") == (100000, 1000, True)
    for bad in ("100000", "1e5:10", "10:10:x"):
        with pytest.raises(SystemExit, match="--cases"):
            accuracy_scale.parse_case(bad)


def _row(method, seconds, queries=False, **extra):
    metrics = {m: 0.5 for m in accuracy_scale.METRICS} if method in ("stock", "engine") else {}
    return dict(
        method=method,
        n=1000,
        classes=10,
        queries=queries,
        dim=128,
        seconds=seconds,
        peak_rss_gib=1.0,
        rss_increase_gib=0.1,
        **metrics,
        **extra,
    )


def test_ratios_compare_rows_of_the_same_case_only():
    rows = [
        _row("gemm_floor", 2.0),
        _row("faiss", 4.0),
        _row("stock", 8.0),
        _row("engine", 1.0, stages={s: 0.1 for s in accuracy_scale.STAGES}, plan={"method": "threshold"}),
        _row("faiss", 100.0, queries=True),  # another case: never a denominator for the self-retrieval rows
        _row("engine", 10.0, queries=True),
    ]
    table = accuracy_scale.render(rows, "cpu")
    engine_self = next(line for line in table.splitlines() if "| self | cpu | engine |" in line)
    assert "| 1.0 | 0.50 | 0.25 | 0.12 |" in engine_self
    engine_q = next(line for line in table.splitlines() if "| N others | cpu | engine |" in line)
    assert "| 10.0 | – | 0.10 | – |" in engine_q
    assert "Engine stages" in table


@pytest.mark.slow
def test_a_tiny_run_writes_json_and_markdown(tmp_path, capsys):
    """The script's main(argv) in this process (its command line's work without a child interpreter's imports);
    every row still runs in its own child process, as in a real run."""
    out = str(tmp_path / "acc")
    with mock.patch.dict(os.environ, {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}):  # the children's
        assert accuracy_scale.main(["--cases", "1500:30", "1500:30:q", "--out", out]) == 0, capsys.readouterr().err
    rows = json.load(open(out + ".json"))["rows"]
    assert {r["method"] for r in rows} == {"gemm_floor", "faiss", "stock", "engine"}
    engine = [r for r in rows if r["method"] == "engine"]
    stock = [r for r in rows if r["method"] == "stock"]
    for e, s in zip(engine, stock):  # the same metrics as stock PML (float32 round-off)
        assert all(abs(e[m] - s[m]) < 1e-6 for m in accuracy_scale.METRICS)
        assert set(e["stages"]) == set(accuracy_scale.STAGES)
    assert "| N × D |" in open(out + ".md").read()


def test_stock_is_skipped_by_its_projected_peak_and_engine_before_by_size(tmp_path):
    # calibrated on the measured stock rows: 100k/1000 peaked at 1.61 GiB, 20k/6 at 4.63 GiB
    assert 1.5 < accuracy_scale.stock_estimate_gib(100000, 1000) < 2.0
    assert 4.6 < accuracy_scale.stock_estimate_gib(20000, 6) < 6.0
    assert accuracy_scale.stock_estimate_gib(300000, 1000) > 6.0
    assert accuracy_scale.expected_k(30000, 10000, False) == 2  # 3 items per class: k = 2 exactly
    out = str(tmp_path / "acc")
    argv = ["--cases", "300000:1000", "--methods", "stock", "engine_before", "--before", "HEAD"]
    assert accuracy_scale.main(argv + ["--before-max-n", "100000", "--out", out]) == 0  # no row is run
    rows = json.load(open(out + ".json"))["rows"]
    assert [r["method"] for r in rows] == ["stock", "engine_before"]
    assert rows[0]["skipped"].startswith("not run: projected peak 8.2 GiB > --max-gib 6")
    assert rows[1]["skipped"] == "not run: N > --before-max-n 100000 (time)"
    text = open(out + ".md").read()
    assert "--before-max-n 100000" in text and "| not run: projected peak" in text
