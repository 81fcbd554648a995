import unittest

import torch

from pml_extensions.explain.folded_embedding import FoldedEmbedding


class TestFoldedEmbedding(unittest.TestCase):
    def test_indexing_keeps_batch_dimension(self):
        f = FoldedEmbedding(
            torch.zeros(3, 2, 4, 5), torch.zeros(3, 5), torch.zeros(3, 5), torch.zeros(3, 7, 2, 4), (8, 16)
        )
        self.assertEqual(len(f), 3)
        self.assertEqual(f.feature_size, (2, 4))
        self.assertEqual(tuple(f[1].features.shape), (1, 2, 4, 5))
        self.assertEqual(tuple(f[-1].bias.shape), (1, 5))
        self.assertEqual(len(f[0:2]), 2)


if __name__ == "__main__":
    unittest.main()
