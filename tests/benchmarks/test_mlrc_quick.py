"""benchmarks/mlrc_quick.py starts every config afresh: a kept experiment folder (which the runner would resume,
reporting its old results) is deleted before the run."""

import importlib.util
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("mlrc_quick", os.path.join(ROOT, "benchmarks", "mlrc_quick.py"))
mlrc_quick = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mlrc_quick)


def test_a_kept_folder_is_deleted_before_the_run(tmp_path, monkeypatch):
    runs = str(tmp_path)
    stale = tmp_path / "contrastive_quick"
    stale.mkdir()
    (stale / "stale.txt").write_text("from an older run")
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"], seen["stale_left"] = cmd, (stale / "stale.txt").exists()
        stale.mkdir(exist_ok=True)
        test = {m: 0.25 for m in mlrc_quick.METRICS}
        (stale / "results.json").write_text(
            json.dumps(
                {"seconds": 7.0, "test": {"separate_128D": test, "concatenated_512D": dict(test, precision_at_1=0.5)}}
            )
        )
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(mlrc_quick.subprocess, "run", fake_run)
    row = mlrc_quick.run_config("contrastive", runs, "cpu")
    assert seen["stale_left"] is False
    assert "--new" not in seen["cmd"] and seen["cmd"][seen["cmd"].index("--root_experiment_folder") + 1] == runs
    assert (row["seconds"], row["precision_at_1_512D"], row["mean_average_precision_at_r_128D"]) == (7.0, 0.5, 0.25)
