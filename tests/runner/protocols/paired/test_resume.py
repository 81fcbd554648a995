"""SIGKILL-resume through the one runner for the main job (``paired`` protocol, ``python -m pml_extensions job``):
kill inside a unit's training, rerun the same command, and compare every log table and every number of
``results.json`` with an uninterrupted run: ``run --reproduce`` of the resumed run, which reruns its saved config from
the start in a fresh process and must give every number exactly. (MLRC: tests/runner/experiment/test_checkpoint.py;
the RAML plugin: tests/benchmarks/protocols/resolution_distillation/test_protocol.py.)"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from pml_extensions.runner.experiment.checkpoint import load_weights
from pml_extensions.runner.protocols.reproduce import numeric_differences
from tests.runner.runner_testing_utils import REPO as ROOT
from tests.runner.runner_testing_utils import dejavu_fonts

JOB = [
    "--num_epochs",
    "3",
    "--iterations_per_epoch",
    "4",
    "--seeds",
    "0",
    "--variants",
    "contrastive_xml",
    "--device",
    "cpu",
    # the glyphs of the DejaVu Sans fonts only (248 of the 682 images of a split): every evaluation embeds its split
    "--dataset",
    "{kwargs: {image_size: 32, font_files: [%s]}}" % ", ".join(dejavu_fonts()),
]


def _job(output, env):
    return subprocess.Popen(
        [sys.executable, "-m", "pml_extensions", "job", "--root_experiment_folder", output] + JOB,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _tables(stage):
    """Every log table of a stage: {table: [(iteration, sorted numeric columns)]}, in row order."""
    db = os.path.join(stage, "logs", "logs.db")
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        names = [
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name != 'sqlite_sequence'")
        ]
        out = {}
        for name in names:
            rows = [dict(r) for r in con.execute(f"SELECT * FROM [{name}] ORDER BY id")]
            out[name] = [
                (
                    r["~iteration~"],
                    sorted(
                        (k, v) for k, v in r.items() if k not in ("id", "~iteration~") and isinstance(v, (int, float))
                    ),
                )
                for r in rows
            ]
        return out
    finally:
        con.close()


@pytest.mark.slow
def test_job_sigkilled_mid_unit_resumes_with_no_lost_or_duplicated_rows(tmp_path, subprocess_env):
    killed_out = str(tmp_path / "killed")
    stage = os.path.join(killed_out, "xml_glyphs", "contrastive_xml", "seed_0")
    ckpt = os.path.join(stage, "checkpoint.pth")
    proc = _job(killed_out, subprocess_env)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(ckpt) and load_weights(ckpt)["epoch"] >= 1:
                time.sleep(0.3)  # inside epoch 2
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
    state = load_weights(ckpt)
    assert 1 <= state["epoch"] < 3 and not state["finished"]

    rerun = _job(killed_out, subprocess_env)
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out
    assert "resuming after epoch" in out

    # the uninterrupted run: --reproduce reruns the resumed run's saved config.yaml from the start and gives every
    # number exactly (CPU, same seed), in a fresh process as a user runs it (in-process, after ~900 other tests, it
    # differed in CI: see the stop-27 note)
    run_folder = os.path.join(killed_out, "xml_glyphs")
    rerun = subprocess.run(
        [sys.executable, "-m", "pml_extensions", "run", "--reproduce", run_folder],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]  # 0: every number equal
    line = next(x for x in rerun.stdout.splitlines() if x.startswith("reproduced exactly: "))
    clean_out = line[len("reproduced exactly: ") :].split(" matches ")[0]
    assert os.path.normpath(clean_out) != os.path.normpath(run_folder) and "resuming" not in rerun.stdout
    clean_state = load_weights(os.path.join(clean_out, "contrastive_xml", "seed_0", "checkpoint.pth"))
    assert clean_state["epoch"] == 3 and clean_state["finished"]

    got = _tables(stage)
    want = _tables(os.path.join(clean_out, "contrastive_xml", "seed_0"))
    assert sorted(got) == sorted(want) and "loss_histories" in got and "accuracies_val" in got
    for table in want:
        its = [r[0] for r in got[table]]
        assert its == sorted(set(its)), f"{table}: duplicated or unordered rows"
        assert its == [r[0] for r in want[table]], f"{table}: lost rows"
        for (_, a), (_, b) in zip(got[table], want[table]):
            assert [k for k, _ in a] == [k for k, _ in b]
            assert [v for _, v in a] == pytest.approx([v for _, v in b], rel=1e-5, abs=1e-6)
    assert [r[0] for r in got["loss_histories"]] == list(range(1, 13))  # 3 epochs x 4 iterations, once each

    a = json.load(open(os.path.join(run_folder, "results.json")))
    b = json.load(open(os.path.join(clean_out, "results.json")))
    assert numeric_differences(a, b) == []
    assert b["variants"] == a["variants"]
