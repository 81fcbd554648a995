import random
import unittest

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as T2

from pml_extensions.datasets import SeededViewDataset, draw_view, seeded_view

from .cache_testing_utils import TinyImages, train_transform


class TestSeededView(unittest.TestCase):
    def test_same_triple_same_view_any_rng_state(self):
        image = TinyImages(n=1)[0][0]
        tf = train_transform()
        torch.manual_seed(123)
        a = seeded_view(tf, image, 0, 4, 2)
        _ = torch.rand(10), random.random(), np.random.rand()  # move every global stream
        b = seeded_view(tf, image, 0, 4, 2)
        self.assertTrue(torch.equal(a, b))
        others = [seeded_view(tf, image, s, i, v) for s, i, v in ((1, 4, 2), (0, 5, 2), (0, 4, 3))]
        self.assertTrue(all(not torch.equal(a, o) for o in others))

    def test_v2_transforms_and_python_random_are_seeded_too(self):
        image = TinyImages(n=1)[0][0]
        # RandomChoice draws from Python's random module, v2 transforms from torch
        tf = T.Compose([T.RandomChoice([T.RandomRotation(30), T.RandomHorizontalFlip(1.0)]), T.ToTensor()])
        tf2 = T2.Compose([T2.RandomResizedCrop(8, antialias=True), T2.ToImage(), T2.ToDtype(torch.float32, True)])
        for t in (tf, tf2):
            outs = {seeded_view(t, image, 0, 1, v).numpy().tobytes() for v in range(6)}
            self.assertGreater(len(outs), 1)
            self.assertTrue(torch.equal(seeded_view(t, image, 0, 1, 3), seeded_view(t, image, 0, 1, 3)))

    def test_caller_streams_are_restored(self):
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)
        expected = (torch.rand(3), random.random(), np.random.rand())
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)
        seeded_view(train_transform(), TinyImages(n=1)[0][0], 0, 0, 0)
        got = (torch.rand(3), random.random(), np.random.rand())
        self.assertTrue(torch.equal(expected[0], got[0]))
        self.assertEqual(expected[1:], got[1:])

    def test_bad_seeds(self):
        for args, message in (((-1, 0, 0), "view_seed must be an int >= 0"), ((0, 0, True), "view must be an int")):
            with self.assertRaisesRegex(ValueError, message):
                seeded_view(lambda x: x, 0, *args)


class TestDrawView(unittest.TestCase):
    def test_reproducible_uniform_and_epoch_dependent(self):
        draws = np.array([[draw_view(0, e, i, 4) for i in range(200)] for e in range(5)])
        again = np.array([[draw_view(0, e, i, 4) for i in range(200)] for e in range(5)])
        self.assertTrue(np.array_equal(draws, again))
        self.assertTrue(all(not np.array_equal(draws[0], draws[e]) for e in range(1, 5)))
        other_seed = np.array([draw_view(1, 0, i, 4) for i in range(200)])
        self.assertFalse(np.array_equal(draws[0], other_seed))
        counts = np.bincount(draws.ravel(), minlength=4)
        self.assertEqual(counts.sum(), 1000)
        self.assertTrue((np.abs(counts - 250) < 60).all(), counts)  # 4.5 binomial sd
        self.assertEqual({draw_view(3, e, 9, 1) for e in range(10)}, {0})

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "num_views must be an int >= 1"):
            draw_view(0, 0, 0, 0)
        with self.assertRaisesRegex(ValueError, "epoch must be an int >= 0"):
            draw_view(0, -1, 0, 2)


class TestSeededViewDataset(unittest.TestCase):
    def test_items_are_the_drawn_view(self):
        data = TinyImages(n=6)
        views = SeededViewDataset(data, train_transform(), num_views=3, view_seed=2, seed=5)
        self.assertEqual(views.labels.dtype, np.int64)
        for epoch in (0, 1):
            views.set_epoch(epoch)
            for i in range(6):
                image, label = views[i]
                v = draw_view(5, epoch, i, 3)
                self.assertEqual(views.view_of(i), v)
                self.assertTrue(torch.equal(image, seeded_view(train_transform(), data[i][0], 2, i, v)))
                self.assertEqual(label, int(data.labels[i]))

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, r"must have a labels array of its length 2, got None"):
            SeededViewDataset(torch.utils.data.TensorDataset(torch.zeros(2)), T.ToTensor())
        views = SeededViewDataset(TinyImages(n=2), T.ToTensor(), num_views=2)
        with self.assertRaisesRegex(ValueError, r"view must be in \[0, 2\), got 2"):
            views.view(0, 2)
        with self.assertRaisesRegex(ValueError, "epoch must be an int >= 0, got -1"):
            views.set_epoch(-1)
