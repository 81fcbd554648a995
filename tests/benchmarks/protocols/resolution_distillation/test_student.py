"""benchmarks/protocols/resolution_distillation/student.py: paired students (same start, same batches within a seed)."""

import unittest

import pytest
import torch

from tests.benchmarks.protocols.resolution_distillation.test_protocol import TINY_JOB


@pytest.mark.usefixtures("mobilenet_weights")
class TestStudents(unittest.TestCase):
    def test_paired_students_start_identical(self):
        from benchmarks.protocols.resolution_distillation import protocol as rd
        from benchmarks.protocols.resolution_distillation import recipe as parts

        job = rd.job_config(TINY_JOB)
        train_set, _ = parts.load_dataset("glyphs", job["datasets"]["glyphs"])
        torch.manual_seed(5)
        teacher = parts.build_model(16)
        ctx = {"seed": 0, "dcfg": job["datasets"]["glyphs"], "db": 32, "train_set": train_set}
        built = {v: rd.build_student(ctx, 16, v, job, teacher) for v in ("full", "loss_abs_only", "augment_no_mixup")}
        for v, trainer in built.items():
            trainer.initialize_dataloader()
            for key in ("trunk", "embedder"):
                for k, w in trainer.models[key].state_dict().items():
                    self.assertTrue(torch.equal(w, teacher[0 if key == "trunk" else 1].state_dict()[k]), (v, key, k))
        first = {v: t.get_batch() for v, t in built.items()}
        (s0, t0, c0), ids0 = first["full"]
        (s1, t1, c1), ids1 = first["loss_abs_only"]
        self.assertTrue(torch.equal(s0, s1) and torch.equal(t0, t1) and torch.equal(ids0, ids1))
        self.assertTrue(torch.equal(ids0, first["augment_no_mixup"][1]))  # same batch order, other augmentations
        self.assertFalse(torch.equal(s0, first["augment_no_mixup"][0][0]))
        other_seed = rd.build_student(dict(ctx, seed=1), 16, "full", job, teacher)
        other_seed.initialize_dataloader()
        self.assertFalse(torch.equal(ids0, other_seed.get_batch()[1]))
