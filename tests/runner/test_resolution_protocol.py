"""The resolution-distillation protocol through the runner CLI (a config folder in the MLRC layout)."""

import json
import os
import tempfile
import unittest

import yaml

from pml_extensions.runner import cli

TINY_JOB = {
    "datasets": {
        "glyphs": {
            "database_resolution": 32, "query_resolutions": [16], "image_size": 32, "max_test_per_class": 4,
            "crop_scale": [0.5, 1.0],
        }
    },
    "seeds": [0], "teacher_iterations": 1, "teacher_lr": 1e-4, "student_iterations": 1, "images_per_batch": 4,
    "num_augmentations": 2, "lr": 1e-4, "lambda_ts": 0.7, "lambda_ss": 0.7, "embedding_dim": 16,
    "eval_batch_size": 64, "device": "cpu", "num_workers": 0,
}


def _write_config(root, general):
    os.makedirs(os.path.join(root, "config_general"))
    with open(os.path.join(root, "config_general", "default.yaml"), "w") as f:
        yaml.safe_dump(general, f)


class TestResolutionProtocol(unittest.TestCase):
    def test_runs_and_writes_the_four_setups(self):
        try:
            from pml_extensions.trunks import mobilenet_v2_weights_path

            mobilenet_v2_weights_path()
        except FileNotFoundError as e:  # pragma: no cover - the tox env installs the weights package
            self.skipTest(str(e))
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "cfg")
            _write_config(cfg, {"protocol": "resolution_distillation", "resolution_job": TINY_JOB})
            rc = cli.main([cfg, "--root_experiment_folder", os.path.join(tmp, "exp"), "--experiment_name", "r"])
            self.assertEqual(rc, 0)
            out = os.path.join(tmp, "exp", "r")
            with open(os.path.join(out, "results.json")) as f:
                result = json.load(f)
            setups = {row["setup"] for row in result["rows"]}
            self.assertEqual(
                setups, {"teacher_student_asymmetric", "student_symmetric", "teacher_symmetric", "teacher_asymmetric"}
            )
            self.assertTrue(all(row["query_flops"] > 0 for row in result["rows"]))
            for name in ("results.md", "performance_vs_flops.png"):
                self.assertGreater(os.path.getsize(os.path.join(out, name)), 0)

    def test_bad_protocol_and_job_are_config_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "cfg")
            _write_config(cfg, {"protocol": "nope"})
            self.assertEqual(cli.main([cfg, "--root_experiment_folder", tmp]), 2)
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "cfg")
            bad = dict(TINY_JOB, datasets={"glyphs": dict(TINY_JOB["datasets"]["glyphs"], query_resolutions=[64])})
            _write_config(cfg, {"protocol": "resolution_distillation", "resolution_job": bad})
            self.assertEqual(cli.main([cfg, "--root_experiment_folder", tmp]), 2)

    def test_shipped_config_parses(self):
        from pml_extensions.runner.cli import find_config_root
        from pml_extensions.runner.config_loader import load_config

        config, _ = load_config(find_config_root("resolution_distillation"), {"config_general": ["default", "quick"]}, {})
        self.assertEqual(config["protocol"], "resolution_distillation")
        self.assertEqual(list(config["resolution_job"]["datasets"]), ["glyphs"])
        self.assertEqual(config["resolution_job"]["device"], "cpu")

    def test_pml_dataset_variants_parse_and_need_a_root(self):
        from pml_extensions.runner.cli import find_config_root
        from pml_extensions.runner.config_loader import load_config
        from pml_extensions.utils.resolution_job import load_dataset

        for name in ("cub", "cars196", "sop"):
            config, _ = load_config(
                find_config_root("resolution_distillation"), {"config_general": ["default", f"with_{name}"]}, {}
            )
            self.assertEqual(list(config["resolution_job"]["datasets"]), [name])
            with self.assertRaisesRegex(FileNotFoundError, name):
                load_dataset(name, {"root": "/nonexistent"})
