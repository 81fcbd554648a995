"""The resolution-distillation protocol through the runner: Table-2 blocks (block 1 included), paired seeds, the
results.json layout, SIGKILL-resume, paired student variants and config errors."""

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock

import pytest
import torch
import yaml

from benchmarks.protocols.resolution_distillation.recipe import resolution_models
from pml_extensions.cli import run as cli
from tests.runner.runner_testing_utils import REPO as ROOT

PROTOCOL = "benchmarks.protocols.resolution_distillation"
TINY_JOB = {
    "datasets": {
        "glyphs": {
            "database_resolution": 32,
            "query_resolutions": [16],
            "image_size": 32,
            "max_test_per_class": 2,
            "crop_scale": [0.5, 1.0],
        }
    },
    "seeds": [0, 1],
    "teacher_iterations": 4,
    "student_iterations": 4,
    "checkpoint_every": 2,
    "images_per_batch": 2,
    "num_augmentations": 2,
    "models": resolution_models(16),
    "eval_batch_size": 64,
    "device": "cpu",
    "num_workers": 0,
    "student_variants": ["loss_abs_only"],
}


def _write_config(root, general):
    os.makedirs(os.path.join(root, "config_general"))
    with open(os.path.join(root, "config_general", "default.yaml"), "w") as f:
        yaml.safe_dump(general, f)


@pytest.mark.usefixtures("mobilenet_weights")
class TestResolutionProtocolRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cfg = os.path.join(cls.tmp.name, "cfg")
        _write_config(cls.cfg, {"protocol": PROTOCOL, **TINY_JOB})

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_cli(self, name):
        return cli.main(
            [self.cfg, "--root_experiment_folder", os.path.join(self.tmp.name, "exp"), "--experiment_name", name]
        )

    def results(self, name):
        with open(os.path.join(self.tmp.name, "exp", name, "results.json")) as f:
            return json.load(f)

    @pytest.mark.slow
    def test_table2_blocks_paired_seeds_and_layout(self):
        self.assertEqual(self.run_cli("whole"), 0)
        result = self.results("whole")
        self.assertEqual(
            sorted(result["variants"]),
            [
                "glyphs/16px/low_resolution_teacher_symmetric",
                "glyphs/16px/student_symmetric",
                "glyphs/16px/student_symmetric/loss_abs_only",
                "glyphs/16px/teacher_asymmetric",
                "glyphs/16px/teacher_student_asymmetric",
                "glyphs/16px/teacher_student_asymmetric/loss_abs_only",
                "glyphs/32px/teacher_symmetric",
            ],
        )
        block1 = result["variants"]["glyphs/16px/low_resolution_teacher_symmetric"]
        self.assertEqual(sorted(block1["per_seed"]), ["0", "1"])
        self.assertIn("mean_average_precision_at_r", block1["mean"])
        rows = [r for r in result["rows"] if r["setup"] == "low_resolution_teacher_symmetric"]
        self.assertEqual([(r["query_resolution"], r["reference_resolution"]) for r in rows], [(16, 16), (16, 16)])
        comps = {(c["variant"], c["baseline"]): c for c in result["comparisons"]}
        c = comps[("glyphs/16px/teacher_student_asymmetric", "glyphs/16px/teacher_asymmetric")]
        self.assertEqual(c["n"], 2)
        self.assertEqual(len(c["ci95"]), 2)
        self.assertIn(
            ("glyphs/16px/teacher_student_asymmetric/loss_abs_only", "glyphs/16px/teacher_student_asymmetric"), comps
        )
        self.assertEqual(sorted({p["iteration"] for p in result["curve"]}), [0, 2, 4])
        self.assertTrue(all(r["query_flops"] > 0 for r in result["rows"]))
        out = os.path.join(self.tmp.name, "exp", "whole")
        for name in ("results.md", "performance_vs_flops.png", "report.html"):
            self.assertGreater(os.path.getsize(os.path.join(out, name)), 0)
        with open(os.path.join(out, "results.md")) as f:
            self.assertIn("paper layout: benchmarks/resolution_distillation.py", f.read())
        # the paper's Table 2 layout lives beside the benchmark (issue 20 item 4), rendered from this results.json
        from tests.benchmarks.test_resolution_distillation_tables import load_bench

        self.assertIn("| 1 symmetric | low_resolution_teacher_symmetric |", load_bench().markdown_tables(result))
        self.explain_round_trip(os.path.join(out, "glyphs", "seed_0"))
        # a rerun finds every stage finished and gives the same results
        self.assertEqual(self.run_cli("whole"), 0)
        self.assertEqual(self.results("whole")["variants"], result["variants"])

        # SIGKILL inside the teacher stage, rerun, SIGKILL inside a student stage, rerun: identical results, no lost
        # or duplicated log rows
        seed0 = os.path.join(self.tmp.name, "exp", "killed", "glyphs", "seed_0")
        for stage in ("teacher", "student_16px_full"):
            self.kill_inside(os.path.join(seed0, stage))
        self.assertEqual(self.run_cli("killed"), 0)
        killed = self.results("killed")
        self.assertEqual(killed["variants"], result["variants"])
        self.assertEqual(killed["curve"], result["curve"])
        for stage, n in (("teacher", 4), ("student_16px_full", 4)):
            with open(os.path.join(seed0, stage, "logs", "loss_histories.csv")) as f:
                iterations = [int(float(r["~iteration~"])) for r in csv.DictReader(f)]
            self.assertEqual(iterations, list(range(1, n + 1)), stage)

    def explain_round_trip(self, seed_folder):
        """``explain`` on the run's own files: the student's ``models.pth`` queries the teacher's, rebuilt from the
        run's ``config.yaml``; the CLI's cosine is the one of the saved weights."""
        import numpy as np
        from PIL import Image

        from benchmarks.protocols.resolution_distillation.recipe import build_model
        from pml_extensions.cli.explain import main as explain_main
        from pml_extensions.explain.reference_images import load_image

        rng = np.random.default_rng(0)
        images = []
        for i in range(2):
            path = os.path.join(self.tmp.name, f"img{i}.png")
            Image.fromarray((rng.random((40, 40, 3)) * 255).astype(np.uint8)).save(path)
            images.append(path)
        nets = {}
        for stage in ("student_16px_full", "teacher"):
            state = torch.load(os.path.join(seed_folder, stage, "models.pth"), weights_only=True)
            trunk, emb = build_model(16, pretrained=False)
            trunk.load_state_dict(state["trunk"]), emb.load_state_dict(state["embedder"])
            nets[stage] = (trunk.eval(), emb.eval())
        with torch.no_grad():
            q = nets["student_16px_full"][1](
                nets["student_16px_full"][0](load_image(images[0], 16, keep_aspect=True)[None])
            )
            r = nets["teacher"][1](nets["teacher"][0](load_image(images[1], 32, keep_aspect=True)[None]))
        expected = float(torch.nn.functional.cosine_similarity(q, r)[0])
        out = os.path.join(self.tmp.name, "why")
        rc = explain_main(
            [
                images[0],
                images[1],
                "--checkpoint",
                os.path.join(seed_folder, "student_16px_full", "models.pth"),
                "--image-size",
                "16",
                "--reference-checkpoint",
                os.path.join(seed_folder, "teacher", "models.pth"),
                "--reference-image-size",
                "32",
                "--out",
                out,
            ]
        )
        self.assertEqual(rc, 0)
        with open(os.path.join(out, "similarity.json")) as f:
            self.assertAlmostEqual(json.load(f)["results"][0]["cosine_similarity"], expected, places=4)

    def kill_inside(self, stage):
        """Start the run in a subprocess and SIGKILL it once ``stage`` has committed its first checkpoint."""
        # the same thread count as this process: the killed runs are resumed here and compared bit for bit
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(torch.get_num_threads()))
        argv = [
            sys.executable,
            "-m",
            "pml_extensions",
            "run",
            self.cfg,
            "--root_experiment_folder",
            os.path.join(self.tmp.name, "exp"),
            "--experiment_name",
            "killed",
        ]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while not os.path.exists(os.path.join(stage, "checkpoint.pth")) and time.time() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertFalse(os.path.exists(os.path.join(stage, "result.json")), f"killed too late inside {stage}")


@pytest.mark.slow
@pytest.mark.usefixtures("mobilenet_weights")
class TestResolutionSelection(unittest.TestCase):
    """Selection on validation classes: the learning rate and each student's checkpoint are the argmax of the
    validation curve, and the test split is never read for them (a run on shuffled test labels chooses the same)."""

    def test_selection_uses_only_validation(self):
        from benchmarks.protocols.resolution_distillation import protocol as rd
        from benchmarks.protocols.resolution_distillation import recipe as parts

        config = dict(
            TINY_JOB,
            protocol=PROTOCOL,
            seeds=[0],
            teacher_iterations=2,  # no teacher is killed here; no low-resolution teacher: it chooses nothing
            low_resolution_teacher=False,
            validation={"class_fraction": 0.25, "seed": 0},
            student_lr_grid=[1e-5, 1e-3],
        )
        load = parts.load_dataset

        def shuffled_test(name, cfg, builder=None):
            train, test = load(name, cfg, builder)
            test.labels = torch.randperm(len(test.labels), generator=torch.Generator().manual_seed(1)).numpy() % 5
            return train, test

        with tempfile.TemporaryDirectory() as tmp:
            plain = rd.run(config, os.path.join(tmp, "plain"), log=lambda *a: None)
            with unittest.mock.patch.object(parts, "load_dataset", shuffled_test):
                other = rd.run(config, os.path.join(tmp, "shuffled"), log=lambda *a: None)
            seed0 = os.path.join(tmp, "plain", "glyphs", "seed_0")
            chosen = {}
            for stage in ("student_16px_full_lr1e-05", "student_16px_full_lr0.001", "student_16px_loss_abs_only"):
                with open(os.path.join(seed0, stage, "result.json")) as f:
                    sel = json.load(f)["selection"]
                curve = sel["curve"]
                self.assertEqual([p["iteration"] for p in curve], [0, 2, 4])
                best = max(curve, key=lambda p: (p["teacher_student_asymmetric"], -p["iteration"]))
                self.assertEqual(
                    (sel["iteration"], sel["validation"]), (best["iteration"], best["teacher_student_asymmetric"])
                )
                kept = torch.load(os.path.join(seed0, stage, "models.pth"), weights_only=True)
                best_w = torch.load(os.path.join(seed0, stage, "best_models.pth"), weights_only=True)
                self.assertTrue(all(torch.equal(kept["trunk"][k], best_w["trunk"][k]) for k in kept["trunk"]))
                chosen[stage] = sel["validation"]
            grid = [s for s in plain["selection"] if s["student_variant"] == "lr_grid"][0]
            self.assertEqual(
                grid["validation_by_lr"],
                {"1e-05": chosen["student_16px_full_lr1e-05"], "0.001": chosen["student_16px_full_lr0.001"]},
            )
            winner = 1e-05 if chosen["student_16px_full_lr1e-05"] >= chosen["student_16px_full_lr0.001"] else 1e-3
            self.assertEqual(grid["lr"], winner)
            self.assertEqual([s["lr"] for s in plain["selection"] if s["student_variant"] != "lr_grid"], [winner] * 2)
            # a run whose test labels are shuffled makes the same choices, yet its test metrics differ
            self.assertEqual(other["selection"], plain["selection"])
            self.assertNotEqual(other["variants"], plain["variants"])
            with open(os.path.join(tmp, "plain", "results.md")) as f:
                self.assertIn("**Selection on the validation classes**", f.read())


@pytest.mark.slow
def test_torchrun_deals_seeds_over_ranks_and_equals_one_process(tmp_path, mobilenet_weights, subprocess_env):
    """Under torchrun (2 gloo processes) the (dataset, seed) units are dealt over the ranks — seed 0 on rank 0, seed
    1 on rank 1, each written by its own rank — and results.json equals the one-process run's."""
    cfg = str(tmp_path / "cfg")
    _write_config(
        cfg,
        dict(
            TINY_JOB,
            protocol=PROTOCOL,
            student_variants=[],
            low_resolution_teacher=False,
            teacher_iterations=2,
            student_iterations=2,
            checkpoint_every=0,
        ),
    )
    env = subprocess_env
    args = ["-m", "pml_extensions", "run", cfg, "--root_experiment_folder", str(tmp_path / "exp")]
    # the one-process reference in this interpreter (no new interpreter's start-up), at the ranks' one thread
    # (subprocess_env: OMP_NUM_THREADS=1) so that its floats are the ranks' bit for bit
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main(args[3:] + ["--experiment_name", "one"]) == 0
    finally:
        torch.set_num_threads(threads)
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + args[1:]
        + ["--experiment_name", "two"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "units dealt over 2 ranks" in two.stdout
    results = [json.load(open(tmp_path / "exp" / name / "results.json")) for name in ("one", "two")]
    assert results[1]["rows"] == results[0]["rows"]
    assert results[1]["variants"] == results[0]["variants"]
    assert sorted(results[1]["variants"]["glyphs/16px/teacher_student_asymmetric"]["per_seed"]) == ["0", "1"]
    for seed in (0, 1):
        assert os.path.exists(
            tmp_path / "exp" / "two" / "glyphs" / f"seed_{seed}" / "student_16px_full" / "result.json"
        )
