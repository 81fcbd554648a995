"""cli/job.py: `job` is `run` on the shipped xml_glyphs config (the paired protocol), its output under runs/."""

import json
import os
import tempfile
import unittest
from unittest import mock

import pytest

from pml_extensions.cli import job
from pml_extensions.runner.protocols.paired import unit as paired_unit
from tests.runner.runner_testing_utils import dejavu_fonts

#: the job's glyph set on the DejaVu Sans fonts alone (248 of 682 images a split): the outputs, not the numbers, are
#: tested
SMALL_GLYPHS = "{kwargs: {image_size: 32, font_files: [%s]}}" % ", ".join(dejavu_fonts())


class TestJob(unittest.TestCase):
    @pytest.mark.slow
    def test_job_writes_results_with_comparisons(self):
        with tempfile.TemporaryDirectory() as out:
            rc = job.main(
                [
                    "--num_epochs",
                    "1",
                    "--iterations_per_epoch",
                    "2",
                    "--seeds",
                    "0",
                    "1",
                    "--root_experiment_folder",
                    out,
                    "--variants",
                    "contrastive_gap",
                    "contrastive_xml",
                    "--dataset",
                    SMALL_GLYPHS,
                ]
            )
            self.assertEqual(rc, 0)
            run = os.path.join(out, "xml_glyphs")
            for name in ("results.md", "results.json", "map_at_r.png", "report.html", "config.yaml"):
                self.assertTrue(os.path.getsize(os.path.join(run, name)) > 0, name)
            with open(os.path.join(run, "results.json")) as f:
                r = json.load(f)
            self.assertEqual(sorted(r["variants"]), ["contrastive_gap", "contrastive_xml"])
            self.assertEqual(sorted(r["variants"]["contrastive_xml"]["per_seed"]), ["0", "1"])
            (c,) = r["comparisons"]
            self.assertEqual((c["variant"], c["baseline"]), ("contrastive_xml", "contrastive_gap"))
            self.assertEqual(len(c["ci95"]), 2)
            self.assertTrue(
                os.path.isfile(os.path.join(run, "contrastive_xml", "seed_1", "logs", "metric_loss_XMLWrapper.csv"))
            )
            self.explain_round_trip(run)
            # a rerun of the same command resumes: finished units are not retrained, results are the same
            with mock.patch.object(paired_unit, "train_and_select", side_effect=AssertionError("retrained")):
                self.assertEqual(
                    job.main(
                        [
                            "--num_epochs",
                            "1",
                            "--iterations_per_epoch",
                            "2",
                            "--seeds",
                            "0",
                            "1",
                            "--root_experiment_folder",
                            out,
                            "--variants",
                            "contrastive_gap",
                            "contrastive_xml",
                            "--dataset",
                            SMALL_GLYPHS,
                        ]
                    ),
                    0,
                )

    def explain_round_trip(self, run):
        """``explain --checkpoint <variant>/seed_0/best_models.pth``: each variant's model (XML: HistogramPooling;
        GAP: average pooling) is rebuilt from the run's config.yaml and its cosine is the one of the saved weights."""
        import numpy as np
        import torch
        from PIL import Image

        from pml_extensions.cli.explain import main as explain_main
        from pml_extensions.explain.reference_images import load_image
        from pml_extensions.runner.objects.saved_models import load_models

        rng = np.random.default_rng(0)
        images = []
        for i in range(2):
            images.append(os.path.join(run, f"img{i}.png"))
            Image.fromarray((rng.random((32, 32)) * 255).astype(np.uint8)).save(images[-1])
        for variant in ("contrastive_xml", "contrastive_gap"):
            ckpt = os.path.join(run, variant, "seed_0", "best_models.pth")
            trunk, emb = load_models(ckpt)
            state = torch.load(ckpt, weights_only=True)
            self.assertTrue(all(torch.equal(v, state["trunk"][k]) for k, v in trunk.state_dict().items()))
            with torch.no_grad():
                # the run's eval transform: 32 px, Normalize(0.5, 0.5); the CLI reads both from the run's config.yaml
                q, r = (emb.eval()(trunk.eval()(load_image(p, 32, 1, True, ([0.5], [0.5]))[None])) for p in images)
            out = os.path.join(run, "why_" + variant)
            self.assertEqual(explain_main([images[0], images[1], "--checkpoint", ckpt, "--out", out]), 0)
            with open(os.path.join(out, "similarity.json")) as f:
                got = json.load(f)["results"][0]["cosine_similarity"]
            self.assertAlmostEqual(got, float(torch.nn.functional.cosine_similarity(q, r)[0]), places=5)

    def test_bad_input(self):
        self.assertEqual(job.main(["--variants", "nope"]), 2)
        self.assertEqual(job.main(["--seed", "1", "--seeds", "0"]), 2)
        with self.assertRaisesRegex(
            Exception, "powerful-benchmarker folder config; run it with python -m pml_extensions run contrastive"
        ):
            job.load_job_config(["contrastive"])


class TestJobArguments(unittest.TestCase):
    """The job's arguments as run's: CONFIG first (default xml_glyphs), runs/ as the root folder."""

    def test_defaults(self):
        self.assertEqual(job.run_argv([]), ["xml_glyphs", "--root_experiment_folder", "runs"])
        args = job.run_argv(["mine", "--num_epochs", "2", "--root_experiment_folder", "o"])
        self.assertEqual(args, ["mine", "--num_epochs", "2", "--root_experiment_folder", "o"])

    def test_options_after_a_bare_double_dash(self):
        config, _ = job.load_job_config(["--", "--num_epochs", "2", "--device", "cpu", "--"])
        self.assertEqual((config["num_epochs"], config["device"]), (2, "cpu"))

    def test_the_old_spellings_are_gone(self):
        """--epochs, --iterations, --output, --dataset-root, --config were pre-1.0 spellings (CHANGELOG): each is now
        a key no config defines, refused with the nearest key."""
        for argv, message in [
            (["--epochs", "2"], "--epochs: no config file defines this key"),
            (["--iterations", "2"], "--iterations: no config file defines this key"),
        ]:
            with self.assertRaisesRegex(Exception, message):
                job.load_job_config(argv)

    def test_load_job_config_is_what_the_job_runs(self):
        config, sources = job.load_job_config(["--seeds", "0", "1", "--variants", "contrastive_xml", "contrastive_gap"])
        self.assertEqual(config["protocol"], "paired")
        self.assertEqual(config["seeds"], [0, 1])  # the command line's words, as the list the protocol reads
        self.assertEqual(list(config["variants"]), ["contrastive_gap", "contrastive_xml"])  # the config's order
        self.assertEqual(config["comparisons"], [["contrastive_xml", "contrastive_gap"]])
        self.assertEqual(sources["seeds"], "command line")
        other, _ = job.load_job_config(["--num_epochs", "2", "--dataset", "openclipart", "--dataset_root", "/d"])
        self.assertEqual((other["num_epochs"], other["dataset"], other["dataset_root"]), (2, "openclipart", "/d"))
