"""cli/job.py: `job` is `run` on the shipped xml_glyphs config; the job's older spellings still work."""

import json
import os
import tempfile
import unittest
from unittest import mock

import pytest

from pml_extensions.cli import job
from pml_extensions.runner.protocols.xml_vs_gap import protocol as xml_vs_gap


class TestJob(unittest.TestCase):
    @pytest.mark.slow
    def test_job_writes_results_with_comparisons(self):
        with tempfile.TemporaryDirectory() as out:
            rc = job.main(
                [
                    "--epochs",
                    "1",
                    "--iterations",
                    "2",
                    "--seeds",
                    "0",
                    "1",
                    "--output",
                    out,
                    "--variants",
                    "contrastive_gap",
                    "contrastive_xml",
                ]
            )
            self.assertEqual(rc, 0)
            run = os.path.join(out, "xml_glyphs")
            for name in ("results.md", "results.json", "map_at_r.png", "prototype_usage.png", "config.yaml"):
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
            with mock.patch.object(xml_vs_gap, "train_and_select", side_effect=AssertionError("retrained")):
                self.assertEqual(
                    job.main(
                        [
                            "--epochs",
                            "1",
                            "--iterations",
                            "2",
                            "--seeds",
                            "0",
                            "1",
                            "--output",
                            out,
                            "--variants",
                            "contrastive_gap",
                            "contrastive_xml",
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

        from pml_extensions.cli.explain import load_image
        from pml_extensions.cli.explain import main as explain_main
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
            job.load_job_config(["--config", "contrastive"])


class TestJobArguments(unittest.TestCase):
    """The job's arguments as run's: CONFIG first, runs/ as the root folder, the older spellings renamed."""

    def run_argv(self, argv):
        notes = []
        return job.run_argv(argv, notes=notes.append), notes

    def test_defaults(self):
        self.assertEqual(self.run_argv([]), (["xml_glyphs", "--root_experiment_folder", "runs"], []))
        args, notes = self.run_argv(["xml_clipart_mobilenet", "--num_epochs", "2", "--root_experiment_folder", "o"])
        self.assertEqual(args, ["xml_clipart_mobilenet", "--num_epochs", "2", "--root_experiment_folder", "o"])
        self.assertEqual(notes, [])

    def test_older_spellings_are_read_as_runs_with_one_note_each(self):
        args, notes = self.run_argv(
            ["--config", "xml_clipart_mobilenet", "--epochs", "2", "--iterations", "20", "--output", "out"]
            + ["--dataset-root", "/data", "--seed", "3", "--dataset", "openclipart"]
        )
        self.assertEqual(
            args,
            ["xml_clipart_mobilenet", "--num_epochs", "2", "--iterations_per_epoch", "20"]
            + [
                "--root_experiment_folder",
                "out",
                "--dataset_root",
                "/data",
                "--seeds",
                "3",
                "--dataset",
                "openclipart",
            ],
        )
        self.assertEqual(len(notes), 6)
        self.assertIn("note: job --epochs is read as --num_epochs", notes[1])

    def test_bad_arguments(self):
        for argv, message in [
            (["--seed", "1", "--seeds", "0"], "--seed and --seeds: give one of them"),
            (["--config"], "--config: needs a config name or folder"),
            (["xml_glyphs", "--config", "other"], "a second config"),
        ]:
            with self.assertRaisesRegex(Exception, message):
                job.run_argv(argv, notes=lambda line: None)

    def test_load_job_config_is_what_the_job_runs(self):
        config, sources = job.load_job_config(["--seeds", "0", "1", "--variants", "contrastive_xml", "contrastive_gap"])
        self.assertEqual(config["protocol"], "xml_vs_gap")
        self.assertEqual(config["seeds"], "0 1")  # the command line's words; the protocol reads them as [0, 1]
        self.assertEqual(list(config["variants"]), ["contrastive_gap", "contrastive_xml"])  # the config's order
        self.assertEqual(config["comparisons"], [["contrastive_xml", "contrastive_gap"]])
        self.assertEqual(sources["seeds"], "command line")
        old, _ = job.load_job_config(["--epochs", "2", "--dataset", "openclipart", "--dataset-root", "/d"])
        self.assertEqual((old["num_epochs"], old["dataset"], old["dataset_root"]), (2, "openclipart", "/d"))
