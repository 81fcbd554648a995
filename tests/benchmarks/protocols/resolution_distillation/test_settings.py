"""benchmarks/protocols/resolution_distillation/settings.py: the protocol's keys, defaults and one-line errors; the
configs of benchmarks/configs/resolution_distillation."""

import os
import tempfile
import unittest

from pml_extensions.cli import run as cli
from pml_extensions.runner.errors import ConfigError
from tests.benchmarks.protocols.resolution_distillation.test_protocol import TINY_JOB, _write_config


class TestResolutionSettings(unittest.TestCase):
    def job(self, **changes):
        """The settings as the loader checks them: the top-level keys against the protocol's, then
        :func:`job_config`."""
        from benchmarks.protocols.resolution_distillation import ResolutionDistillation
        from benchmarks.protocols.resolution_distillation import settings as rd
        from pml_extensions.runner.protocols import check_keys

        config = dict(TINY_JOB, **changes)
        check_keys(config, {}, ResolutionDistillation)
        return rd.job_config(config)

    def test_errors_name_the_key(self):
        glyphs = TINY_JOB["datasets"]["glyphs"]
        cases = [
            (
                {"student_iteration": 3},
                "student_iteration: the resolution_distillation protocol reads no such key; did you mean "
                "student_iterations",
            ),
            (
                {"datasets": {"glyphs": dict(glyphs, query_resolutions=[64])}},
                r"query resolution 64 must be in \(0, database_resolution=32\)",
            ),
            ({"datasets": {"glyphs": dict(glyphs, query_resolution=[8])}}, "did you mean 'query_resolutions'"),
            ({"student_variants": ["loss_abs"]}, "student_variants: unknown"),
            ({"checkpoint_every": 3}, "checkpoint_every: 3 must divide teacher_iterations"),
            ({"seeds": [0, 0]}, "seeds: expected distinct seeds"),
            ({"datasets": {"mnist": glyphs}}, "unknown dataset"),
            ({"validation": {"class_fraction": 1.5}}, r"validation.class_fraction: a number in \(0, 1\)"),
            ({"validation": {"fraction": 0.25}}, "validation: unknown key 'fraction'; did you mean 'class_fraction'"),
            ({"validation": 0.25}, "validation: expected a mapping, got 0.25"),
            ({"student_lr_grid": [1e-4]}, "student_lr_grid: needs validation"),
            (
                {"student_lr_grid": [1e-4, -1], "validation": {}},
                "student_lr_grid: a non-empty list of distinct positive",
            ),
            ({"student_lr_grid": [1e-4], "lr": 1e-4, "validation": {}}, "give lr .* or student_lr_grid"),
        ]
        for changes, message in cases:
            with self.assertRaisesRegex(ConfigError, message):
                self.job(**changes)

    def test_seeds_as_the_command_line_gives_them(self):
        self.assertEqual(self.job(seeds=[3, 4, 5])["seeds"], [3, 4, 5])
        self.assertEqual(self.job(seeds="0 1 2")["seeds"], [0, 1, 2])  # --seeds 0 1 2
        self.assertEqual(self.job(seeds=7)["seeds"], [7])
        with self.assertRaisesRegex(ConfigError, "seeds: expected a non-empty list of non-negative integers"):
            self.job(seeds="0 x")

    def test_bad_protocol_is_a_config_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "cfg")
            _write_config(cfg, {"protocol": "nope"})
            self.assertEqual(cli.main([cfg, "--root_experiment_folder", tmp]), 2)

    def test_shipped_configs_parse(self):
        from benchmarks.protocols import config_path
        from benchmarks.protocols.resolution_distillation import settings as rd
        from benchmarks.protocols.resolution_distillation.recipe import load_dataset
        from pml_extensions.runner.protocols import load_config

        root = config_path("resolution_distillation")
        config, _ = load_config(root, {"config_general": ["default", "quick"]}, {})
        job = rd.job_config(config)
        self.assertEqual(config["protocol"], "benchmarks.protocols.resolution_distillation")
        self.assertEqual(list(job["datasets"]), ["glyphs"])
        self.assertEqual(job["device"], "cpu")
        self.assertEqual(len(job["seeds"]), 3)
        self.assertIn("init_imagenet", job["student_variants"])
        self.assertEqual(rd.job_config(load_config(root, {"config_general": ["default"]}, {})[0])["device"], "cuda")
        for name in ("cub", "cars196", "sop"):
            config, _ = load_config(root, {"config_general": ["default", f"with_{name}"]}, {})
            self.assertEqual(list(rd.job_config(config)["datasets"]), [name])
            with self.assertRaisesRegex(FileNotFoundError, name):
                load_dataset(name, {"root": "/nonexistent"})
