import unittest

import torch
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_extensions.knn.asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator
from pml_extensions.testers.asymmetric_tester import SETUPS, AsymmetricTester

CPU = torch.device("cpu")


def tiny_model(seed):
    g = torch.Generator().manual_seed(seed)
    trunk = torch.nn.Conv2d(3, 4, kernel_size=1, bias=False)
    with torch.no_grad():
        trunk.weight.copy_(torch.randn(4, 3, 1, 1, generator=g))
    embedder = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    return trunk, embedder


class Images(torch.utils.data.Dataset):
    """20 images, 4 classes x 5, at any resolution (bilinear resize of the same 16 x 16 base images)."""

    def __init__(self, resolution):
        g = torch.Generator().manual_seed(0)
        base = torch.rand(20, 3, 16, 16, generator=g) + torch.linspace(0, 1, 20).view(20, 1, 1, 1)
        self.images = torch.nn.functional.interpolate(base, size=(resolution, resolution), mode="bilinear")
        self.labels = torch.arange(4).repeat_interleave(5)

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def make_dicts(resolution):
    return {"test": Images(resolution)}


def make_tester(**kw):
    return AsymmetricTester(data_device=CPU, dataloader_num_workers=0, batch_size=7, **kw)


class TestAsymmetricTester(unittest.TestCase):
    def test_same_model_reproduces_pml_tester(self):
        trunk, embedder = tiny_model(0)
        stock = GlobalEmbeddingSpaceTester(
            data_device=CPU, dataloader_num_workers=0, accuracy_calculator=AccuracyCalculator(device=CPU)
        ).test(make_dicts(16), 1, trunk, embedder)
        ours = make_tester().test(
            make_dicts(16),
            1,
            trunk,
            embedder,
            reference_trunk_model=trunk,
            reference_embedder_model=embedder,
            reference_dataset_dict=make_dicts(16),
        )
        for key, value in stock["test"].items():
            self.assertAlmostEqual(ours["test"][key], value, places=6, msg=key)  # float32 round-off
        self.assertIn("mean_average_precision_trapezoidal_level0", ours["test"])
        # without reference arguments it is the plain tester too
        plain = make_tester().test(make_dicts(16), 1, trunk, embedder)
        for key, value in stock["test"].items():
            self.assertAlmostEqual(plain["test"][key], value, places=6, msg=key)

    def test_asymmetric_equals_calculator_on_the_two_embedding_sets(self):
        (t_trunk, t_emb), (s_trunk, s_emb) = tiny_model(0), tiny_model(1)
        t = make_tester()
        acc = t.test(
            make_dicts(8),
            1,
            s_trunk,
            s_emb,
            reference_trunk_model=t_trunk,
            reference_embedder_model=t_emb,
            reference_dataset_dict=make_dicts(16),
        )["test"]
        q, ql = t.get_all_embeddings(Images(8), s_trunk, s_emb)
        r, rl = t.get_all_embeddings(Images(16), t_trunk, t_emb)
        expected = AsymmetricAccuracyCalculator(device=CPU).get_accuracy(
            q, ql[:, 0], r, rl[:, 0], self_indices=torch.arange(20)
        )
        for key, value in expected.items():
            self.assertEqual(acc[f"{key}_level0"], value, key)

    def test_query_flops_by_hand(self):
        # 1x1 conv 3 -> 4 channels: 3 * 4 multiply-adds per pixel = 24 FLOPs per pixel; pooling is not counted.
        trunk, embedder = tiny_model(0)
        trunk.train()
        self.assertEqual(AsymmetricTester.query_flops(trunk, embedder, 8), 24 * 64)
        self.assertEqual(AsymmetricTester.query_flops(trunk, embedder, 4), 24 * 16)
        self.assertTrue(trunk.training)  # mode restored

    def test_four_setups(self):
        teacher, student = tiny_model(0), tiny_model(1)
        t = make_tester()
        out = t.evaluate_setups(make_dicts, teacher, student, query_resolution=8, database_resolution=16)
        self.assertEqual(list(out), list(SETUPS))
        self.assertEqual(out["teacher_student_asymmetric"]["query_flops"], 24 * 64)
        self.assertEqual(out["teacher_symmetric"]["query_flops"], 24 * 256)
        self.assertEqual(out["teacher_asymmetric"]["query_resolution"], 8)
        self.assertEqual(out["teacher_asymmetric"]["reference_resolution"], 16)
        # each setup equals test() with the corresponding models and datasets
        expect = {
            "teacher_student_asymmetric": (student, 8, teacher, 16),
            "student_symmetric": (student, 8, student, 8),
            "teacher_symmetric": (teacher, 16, teacher, 16),
            "teacher_asymmetric": (teacher, 8, teacher, 16),
        }
        for setup, (qm, qr, rm, rr) in expect.items():
            ref = make_tester().test(
                make_dicts(qr),
                0,
                *qm,
                reference_trunk_model=rm[0],
                reference_embedder_model=rm[1],
                reference_dataset_dict=make_dicts(rr),
            )["test"]
            self.assertEqual(out[setup]["accuracies"]["test"], ref, setup)

    def test_bad_input(self):
        teacher, student = tiny_model(0), tiny_model(1)
        t = make_tester()
        with self.assertRaisesRegex(ValueError, "query_resolution must be a positive int"):
            t.evaluate_setups(make_dicts, teacher, student, query_resolution=0, database_resolution=16)
        with self.assertRaisesRegex(ValueError, "image_size"):
            AsymmetricTester.query_flops(*teacher, image_size=-4)
        with self.assertRaisesRegex(ValueError, "unknown setups"):
            t.evaluate_setups(make_dicts, teacher, student, 8, 16, setups=("naive",))
        with self.assertRaisesRegex(ValueError, "student is required"):
            t.evaluate_setups(make_dicts, teacher, None, 8, 16)
        with self.assertRaisesRegex(TypeError, "teacher must be"):
            t.evaluate_setups(make_dicts, "resnet", student, 8, 16)

        class Shuffled(Images):
            def __getitem__(self, i):
                return super().__getitem__(19 - i)

        with self.assertRaisesRegex(ValueError, "same images in the same order"):
            t.test(
                make_dicts(8),
                0,
                *student,
                reference_trunk_model=teacher[0],
                reference_embedder_model=teacher[1],
                reference_dataset_dict={"test": Shuffled(16)},
            )
        wide = torch.nn.Conv2d(3, 6, 1)
        with self.assertRaisesRegex(ValueError, "D=4 but reference embeddings have D=6"):
            t.test(make_dicts(8), 0, *student, reference_trunk_model=wide, reference_embedder_model=student[1])
