"""Tests for PatchClassificationLoss (paper Sec. 3.3, Eq. 3.1 auxiliary term)."""

import math
import unittest

import torch

from pml_extensions.losses.patch_classification_loss import PatchClassificationLoss


class TestPatchClassificationLoss(unittest.TestCase):
    def test_hand_value(self):
        # one image, label 1, two pixels: logits [0, ln 3] -> p(1) = 3/4 -> CE = ln(4/3); logits [0, 0] -> ln
        # 2.
        # Mean over the two pixels.
        scores = torch.tensor([[[[0.0, 0.0]], [[math.log(3.0), 0.0]]]], dtype=torch.float64)  # [1, 2, 1, 2]
        loss = PatchClassificationLoss()(scores, torch.tensor([1]))
        self.assertAlmostEqual(float(loss), (math.log(4 / 3) + math.log(2)) / 2, places=14)

    def test_uniform_scores_and_list(self):
        # all-zero logits: CE = ln c at every pixel, for any label; a list of maps is averaged
        scores = torch.zeros(3, 5, 4, 2, dtype=torch.float64)
        labels = torch.tensor([0, 4, 2])
        self.assertAlmostEqual(float(PatchClassificationLoss()(scores, labels)), math.log(5), places=14)
        self.assertAlmostEqual(
            float(PatchClassificationLoss()([scores, torch.zeros(3, 5, 1, 1, dtype=torch.float64)], labels)),
            math.log(5),
            places=14,
        )

    def test_equals_per_pixel_loop(self):
        g = torch.Generator().manual_seed(0)
        scores = torch.randn(2, 3, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
        labels = torch.tensor([2, 0])
        loop = torch.stack(
            [
                torch.nn.functional.cross_entropy(scores[b, :, i, j][None], labels[b : b + 1])
                for b in range(2)
                for i in range(2)
                for j in range(3)
            ]
        ).mean()
        loss = PatchClassificationLoss()(scores, labels)
        torch.testing.assert_close(loss, loop)
        loss.backward()
        self.assertIsNotNone(scores.grad)

    def test_bad_input(self):
        loss = PatchClassificationLoss()
        with self.assertRaisesRegex(ValueError, r"\[0, 3\)"):
            loss(torch.zeros(2, 3, 2, 2), torch.tensor([0, 3]))
        with self.assertRaises(ValueError):
            loss(torch.zeros(2, 3), torch.tensor([0, 1]))
        with self.assertRaises(ValueError):
            loss(torch.zeros(2, 3, 2, 2), torch.tensor([0, 1, 1]))
        with self.assertRaises(TypeError):
            loss(torch.zeros(2, 3, 2, 2), torch.tensor([0.0, 1.0]))
        with self.assertRaises(ValueError):
            loss([], torch.tensor([0]))
