import copy
import os
import tempfile
import unittest

import numpy as np

from pml_extensions.utils import resolution_job as job


def fake_rows():
    rows = []
    for seed, val in ((0, 0.2), (1, 0.4)):
        rows.append(
            {
                "dataset": "glyphs",
                "setup": "teacher_student_asymmetric",
                "query_resolution": 24,
                "database_resolution": 64,
                "reference_resolution": 64,
                "seed": seed,
                "query_flops": 2e6,
                **{m: val for m in job.METRICS},
            }
        )
    rows.append(
        {
            "dataset": "glyphs",
            "setup": "teacher_symmetric",
            "query_resolution": 64,
            "database_resolution": 64,
            "reference_resolution": 64,
            "seed": None,
            "query_flops": 8e6,
            **{m: 0.5 for m in job.METRICS},
        }
    )
    return rows


class TestResolutionJob(unittest.TestCase):
    def test_cap_per_class(self):
        labels = np.array([0] * 5 + [1] * 2 + [2] * 4)
        idx = job.cap_per_class(labels, 3, seed=0)
        self.assertEqual(np.bincount(labels[idx]).tolist(), [3, 2, 3])
        self.assertTrue(np.array_equal(idx, job.cap_per_class(labels, 3, seed=0)))
        self.assertEqual(len(job.cap_per_class(labels, None)), 11)

    def test_eval_transform_size(self):
        from PIL import Image

        out = job.eval_transform(24)(Image.new("RGB", (50, 30)))
        self.assertEqual(tuple(out.shape), (3, 24, 24))

    def test_summary_table_and_plot(self):
        summary = job.summarize(fake_rows())
        first = [s for s in summary if s["setup"] == "teacher_student_asymmetric"][0]
        self.assertAlmostEqual(first["MAP@R"], 0.3)  # mean of 0.2 and 0.4
        self.assertAlmostEqual(first["MAP@R std"], 0.1)
        self.assertEqual(first["num_seeds"], 2)
        table = job.markdown_table(summary)
        self.assertIn("| glyphs | teacher_student_asymmetric | 24 | 64 | 2.0 | 30.00 ± 10.00", table)
        self.assertIn("| glyphs | teacher_symmetric | 64 | 64 | 8.0 | 50.00 |", table)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "fig.png")
            job.plot_performance_vs_flops(summary, path)
            with open(path, "rb") as f:
                self.assertEqual(f.read(4), b"\x89PNG")

    def test_bad_config(self):
        cfg = copy.deepcopy(job.QUICK_CONFIG)
        cfg["datasets"] = {"glyphs": dict(cfg["datasets"]["glyphs"], query_resolutions=[64])}
        with self.assertRaisesRegex(ValueError, "query resolution 64 must be in"):
            job.run_resolution_job(cfg, log=lambda *a: None)
        with self.assertRaisesRegex(ValueError, "unknown dataset"):
            job.load_dataset("mnist", {})

    def test_tiny_end_to_end_on_glyphs(self):
        try:
            from pml_extensions.trunks.pretrained import mobilenet_v2_weights_path

            mobilenet_v2_weights_path()
        except FileNotFoundError as e:
            self.skipTest(str(e))
        cfg = copy.deepcopy(job.QUICK_CONFIG)
        cfg["datasets"] = {
            "glyphs": dict(
                cfg["datasets"]["glyphs"],
                query_resolutions=[16],
                database_resolution=32,
                image_size=32,
                max_test_per_class=2,
            )
        }
        cfg.update(
            seeds=[0],
            teacher_iterations=1,
            student_iterations=1,
            images_per_batch=2,
            num_augmentations=2,
            embedding_dim=16,
        )
        out = job.run_resolution_job(cfg, log=lambda *a: None)
        setups = sorted(r["setup"] for r in out["rows"])
        self.assertEqual(
            setups,
            sorted(["teacher_symmetric", "teacher_asymmetric", "teacher_student_asymmetric", "student_symmetric"]),
        )
        for r in out["rows"]:
            for m in job.METRICS:
                self.assertTrue(0 <= r[m] <= 1, (r["setup"], m, r[m]))
            self.assertGreater(r["query_flops"], 0)
