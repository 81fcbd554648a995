import unittest

import numpy as np
import torch
from pytorch_metric_learning.losses import ContrastiveLoss

from pml_extensions.losses import XMLWrapper
from pml_extensions.losses.xml_wrapper import attach_to_models
from pml_extensions.trunks import HistogramPooling
from pml_extensions.utils.class_split import class_disjoint_split


def batch(seed=0, n_per=3, classes=4, m=6, c=5):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(n_per)
    z = torch.softmax(3 * torch.randn(len(labels), m, generator=g, dtype=torch.float64), dim=1)
    pooled = torch.randn(len(labels), c, generator=g, dtype=torch.float64)
    return z, pooled, labels


def ridge_np(z, y, eps=0.05):
    z, y = z.numpy(), y.numpy()
    return torch.from_numpy(np.linalg.inv(z.T @ z + eps * np.eye(z.shape[1])) @ z.T @ y)


class TestRidgeTarget(unittest.TestCase):
    def test_pooled_target_is_the_papers_formula(self):
        z, pooled, labels = batch()
        head = torch.nn.Linear(5, 3).double()
        emb = head(pooled)
        inner = ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)
        w = XMLWrapper(inner, xml_weight=0.5, ridge=0.05, seed=7, target="pooled", head=head)
        out = w(emb, labels, histograms=z, pooled=pooled)
        h1, h2 = class_disjoint_split(labels, torch.Generator().manual_seed(7))
        v1, v2 = ridge_np(z[h1], pooled[h1]), ridge_np(z[h2], pooled[h2])  # GAP vectors as combinations of prototypes
        expected = inner(emb, labels) + 0.5 * (
            inner(head(z[h1] @ v2), labels[h1]) + inner(head(z[h2] @ v1), labels[h2])
        )
        self.assertAlmostEqual(out.item(), expected.item(), places=10)

    def test_targets_agree_for_a_linear_head_without_bias_and_differ_with_a_bias(self):
        z, pooled, labels = batch(1)
        for bias, agree in ((False, True), (True, False)):
            torch.manual_seed(0)
            head = torch.nn.Linear(5, 3, bias=bias).double()
            with torch.no_grad():
                if bias:
                    head.bias.fill_(2.0)
            emb = head(pooled)
            halves = class_disjoint_split(labels, torch.Generator().manual_seed(0))
            w = XMLWrapper(ContrastiveLoss(), target="pooled", head=head)
            p1, p2 = w.cross_predictions(pooled, z, halves)
            e1, e2 = w.cross_predictions(emb, z, halves)  # target="embeddings"
            same = torch.allclose(head(p1), e1, atol=1e-10) and torch.allclose(head(p2), e2, atol=1e-10)
            self.assertEqual(same, agree, f"bias={bias}")

    def test_attach_head_and_layer_keeps_pooled(self):
        pool = HistogramPooling(4, 3)
        trunk = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), pool, torch.nn.Flatten())
        embedder = torch.nn.Linear(4, 2)
        w = XMLWrapper(ContrastiveLoss(), target="pooled").attach(trunk)
        self.assertEqual(attach_to_models({"m": w}, {"trunk": trunk, "embedder": embedder}), 1)  # the head only
        self.assertIs(w.head[1], embedder)
        self.assertEqual([n for n, _ in w.named_parameters()], [])  # the head is not the loss's parameter
        x = torch.randn(8, 1, 6, 6)
        emb = embedder(trunk(x))
        self.assertTrue(torch.equal(pool.last_pooled.detach(), trunk[0](x).mean(dim=(2, 3)).detach()))
        loss = w(emb, torch.arange(4).repeat_interleave(2))
        loss.backward()
        self.assertIsNotNone(pool.prototype_conv.weight.grad)

    def test_errors(self):
        z, pooled, labels = batch()
        with self.assertRaisesRegex(ValueError, "target must be"):
            XMLWrapper(ContrastiveLoss(), target="gap")
        w = XMLWrapper(ContrastiveLoss(), target="pooled")
        with self.assertRaisesRegex(ValueError, "needs a head"):
            w(pooled[:, :3], labels, histograms=z, pooled=pooled)
        with self.assertRaisesRegex(ValueError, "pooled must be"):
            XMLWrapper(ContrastiveLoss(), target="pooled", head=torch.nn.Identity())(
                pooled, labels, histograms=z, pooled=pooled[:3]
            )
