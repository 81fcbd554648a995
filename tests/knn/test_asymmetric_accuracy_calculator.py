import unittest

import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_extensions.knn.asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator

CPU = torch.device("cpu")


def calc(**kw):
    return AsymmetricAccuracyCalculator(device=CPU, **kw)


class TestAsymmetricAccuracyCalculator(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.functional.normalize(torch.randn(40, 8, generator=g), dim=1)
        self.labels = torch.randint(0, 5, (40,), generator=g)

    def test_same_model_reproduces_pml_exactly(self):
        stock = AccuracyCalculator(device=CPU).get_accuracy(self.emb, self.labels)
        ours = calc().get_accuracy(self.emb, self.labels, self.emb.clone(), self.labels, ref_includes_query=True)
        for key, value in stock.items():
            self.assertAlmostEqual(ours[key], value, places=6, msg=key)  # float32 round-off
        self.assertEqual(ours["recall_at_1"], stock["precision_at_1"])
        # query a subset against a larger reference that starts with it, and k = max_bin_count
        stock = AccuracyCalculator(device=CPU, k="max_bin_count").get_accuracy(
            self.emb[:15], self.labels[:15], self.emb, self.labels, ref_includes_query=True
        )
        ours = calc(k="max_bin_count").get_accuracy(
            self.emb[:15], self.labels[:15], self.emb, self.labels, ref_includes_query=True
        )
        for key, value in stock.items():
            self.assertAlmostEqual(ours[key], value, places=6, msg=key)  # float32 round-off
        # no self in the reference
        stock = AccuracyCalculator(device=CPU).get_accuracy(
            self.emb[:10], self.labels[:10], self.emb[10:], self.labels[10:]
        )
        ours = calc().get_accuracy(self.emb[:10], self.labels[:10], self.emb[10:], self.labels[10:])
        for key, value in stock.items():
            self.assertAlmostEqual(ours[key], value, places=6, msg=key)  # float32 round-off

    def test_pml_key_names_kept(self):
        keys = set(calc().get_curr_metrics())
        self.assertTrue(set(AccuracyCalculator(device=CPU).get_curr_metrics()) <= keys)
        self.assertTrue({"mean_average_precision_trapezoidal", "recall_at_1"} <= keys)

    def test_self_excluded_by_index_when_not_nearest(self):
        # 2-D toy. Reference (teacher): r0 = (1, 0) label A, r1 = (0, 1) label B, r2 = (0.8, 0.6) label A.
        # Query 0 is image 0 seen by a student: q0 = (0.6, 0.8), nearest order r1? dot: r0 .6, r1 .8, r2 .96 ->
        # ranking r2, r1, r0. By index we drop r0 (its own image): [r2, r1] -> P@1 = 1, relevant = {r2}
        # (AP = 1). PML's "drop the first neighbour" would drop r2 and rank r1 first (P@1 = 0).
        ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
        ref_labels = torch.tensor([0, 1, 0])
        query = torch.tensor([[0.6, 0.8]])
        c = calc(include=("precision_at_1", "mean_average_precision", "mean_average_precision_trapezoidal"))
        d, idx = c.knn_excluding_self(query, 2, ref, torch.tensor([0]))
        self.assertEqual(idx.tolist(), [[2, 1]])
        acc = c.get_accuracy(query, torch.tensor([0]), ref, ref_labels, ref_includes_query=True)
        self.assertEqual(acc["precision_at_1"], 1.0)
        self.assertEqual(acc["mean_average_precision"], 1.0)
        self.assertEqual(acc["mean_average_precision_trapezoidal"], 1.0)
        # the stock calculator refuses this layout
        with self.assertRaisesRegex(ValueError, "must be equal to query"):
            AccuracyCalculator(device=CPU).get_accuracy(query, torch.tensor([0]), ref, ref_labels, True)

    def test_image_appearing_twice(self):
        # reference rows 0 and 3 are the same image (a duplicate, same embedding and label). The query is image 0
        # (self index 0) with exactly that embedding: rows 0 and 3 tie at the top. By index only row 0 goes, the
        # duplicate stays and is ranked first. Labels: r0 A, r1 B, r2 B, r3 A -> one relevant (r3) at rank 1.
        ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]])
        ref_labels = torch.tensor([0, 1, 1, 0])
        c = calc(include=("precision_at_1", "mean_average_precision_trapezoidal", "mean_average_precision_at_r"))
        _, idx = c.knn_excluding_self(ref[:1], 3, ref, torch.tensor([0]))
        self.assertEqual(sorted(idx[0].tolist()), [1, 2, 3])
        self.assertEqual(idx[0, 0].item(), 3)
        acc = c.get_accuracy(ref[:1], ref_labels[:1], ref, ref_labels, self_indices=torch.tensor([0]))
        self.assertEqual(
            acc,
            {
                "precision_at_1": 1.0,
                "mean_average_precision_trapezoidal": 1.0,
                "mean_average_precision_at_r": 1.0,
            },
        )
        # when the query is the duplicate (self index 3), row 0 stays instead
        _, idx = c.knn_excluding_self(ref[:1], 3, ref, torch.tensor([3]))
        self.assertEqual(sorted(idx[0].tolist()), [0, 1, 2])

    def test_self_indices_arbitrary_positions(self):
        # queries are reference rows 5..9 in shuffled order; must equal the PML layout after reordering
        perm = torch.tensor([7, 5, 9, 6, 8])
        rest = torch.tensor([i for i in range(40) if i not in perm.tolist()])
        pml_ref = torch.cat([self.emb[perm], self.emb[rest]])
        pml_lab = torch.cat([self.labels[perm], self.labels[rest]])
        stock = AccuracyCalculator(device=CPU).get_accuracy(self.emb[perm], self.labels[perm], pml_ref, pml_lab, True)
        ours = calc().get_accuracy(self.emb[perm], self.labels[perm], self.emb, self.labels, self_indices=perm)
        for key in ("precision_at_1", "mean_average_precision_at_r", "r_precision", "mean_average_precision"):
            self.assertAlmostEqual(ours[key], stock[key], places=6)  # float32 round-off

    def test_bad_input(self):
        c = calc()
        with self.assertRaisesRegex(ValueError, "same dimension D"):
            c.get_accuracy(self.emb, self.labels, torch.zeros(40, 4), self.labels)
        with self.assertRaisesRegex(ValueError, "same length"):
            c.get_accuracy(self.emb, self.labels[:5], self.emb, self.labels)
        with self.assertRaisesRegex(ValueError, "self_indices must lie"):
            c.get_accuracy(self.emb[:2], self.labels[:2], self.emb, self.labels, self_indices=torch.tensor([0, 40]))
        with self.assertRaisesRegex(ValueError, "length 2"):
            c.get_accuracy(self.emb[:2], self.labels[:2], self.emb, self.labels, self_indices=torch.tensor([0]))
        with self.assertRaisesRegex(ValueError, "labels different"):
            wrong = int(torch.where(self.labels != self.labels[0])[0][0])
            c.get_accuracy(self.emb[:1], self.labels[:1], self.emb, self.labels, self_indices=torch.tensor([wrong]))
        with self.assertRaisesRegex(ValueError, "first reference rows"):
            c.get_accuracy(self.emb, self.labels, self.emb[:5], self.labels[:5], ref_includes_query=True)
