import itertools
import unittest

import torch

from pml_extensions.utils import class_disjoint_split


def _split(labels, seed=0):
    return class_disjoint_split(torch.tensor(labels), torch.Generator().manual_seed(seed))


class TestClassDisjointSplit(unittest.TestCase):
    def check_disjoint(self, labels, halves):
        labels = torch.as_tensor(labels)
        a, b = halves
        self.assertEqual(sorted(torch.cat([a, b]).tolist()), list(range(len(labels))))
        self.assertFalse(set(labels[a].tolist()) & set(labels[b].tolist()))

    def test_disjoint_for_any_order_and_class_count(self):
        for num_classes in (2, 3, 4, 5, 8):
            grouped = [c for c in range(num_classes) for _ in range(4)]
            interleaved = [c for _ in range(4) for c in range(num_classes)]
            g = torch.Generator().manual_seed(num_classes)
            shuffled = [grouped[i] for i in torch.randperm(len(grouped), generator=g)]
            for labels in (grouped, interleaved, shuffled):
                for seed in range(3):
                    halves = _split(labels, seed)
                    self.check_disjoint(labels, halves)
                    n1 = len(set(torch.tensor(labels)[halves[0]].tolist()))
                    n2 = len(set(torch.tensor(labels)[halves[1]].tolist()))
                    self.assertEqual(sorted([n1, n2]), [num_classes // 2, (num_classes + 1) // 2])

    def test_same_seed_same_split_and_order_invariance(self):
        labels = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        a = _split(labels, 7)
        b = _split(labels, 7)
        self.assertTrue(all(torch.equal(x, y) for x, y in zip(a, b)))
        # the same label multiset in another order puts each class on the same side
        perm = [9, 2, 5, 0, 7, 1, 3, 8, 6, 4]
        c = _split([labels[i] for i in perm], 7)
        side = {labels[i]: 0 for i in a[0].tolist()}
        side.update({labels[i]: 1 for i in a[1].tolist()})
        permuted = [labels[i] for i in perm]
        for s, half in enumerate(c):
            self.assertTrue(all(side[permuted[i]] == s for i in half.tolist()))

    def test_different_seeds_give_different_splits(self):
        labels = list(itertools.chain.from_iterable([c, c] for c in range(10)))
        splits = {tuple(_split(labels, s)[0].tolist()) for s in range(10)}
        self.assertGreater(len(splits), 1)

    def test_each_half_gets_a_positive_pair(self):
        # classes 0 and 1 have pairs, 2..5 are singletons: pairs must land on different sides
        labels = [0, 0, 1, 1, 2, 3, 4, 5]
        for seed in range(10):
            a, b = _split(labels, seed)
            for half in (a, b):
                vals = torch.tensor(labels)[half]
                self.assertTrue(any((vals == c).sum() >= 2 for c in vals.unique()))

    def test_cannot_split(self):
        self.assertIsNone(_split([0, 0, 0, 0]))
        self.assertIsNone(_split([0, 1, 2, 3]))
        self.assertIsNone(_split([0, 0, 1, 2]))

    def test_bad_labels(self):
        with self.assertRaisesRegex(ValueError, "labels"):
            class_disjoint_split(torch.zeros(4))
        with self.assertRaisesRegex(ValueError, "labels"):
            class_disjoint_split(torch.zeros(2, 2, dtype=torch.long))
