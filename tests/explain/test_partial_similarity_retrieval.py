import unittest

import numpy as np
import torch

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from pml_extensions.explain.partial_similarity_retrieval import PartialSimilarityRetrieval
from tests.explain.explain_testing_utils import images, make_model


class TestPartialSimilarityRetrieval(unittest.TestCase):
    def setUp(self):
        self.trunk, self.emb = make_model("gap")
        self.dec = ActivationDecomposition(self.trunk, self.emb)
        self.psr = PartialSimilarityRetrieval(self.dec)
        self.q = images(1, seed=1)
        self.db = images(6, seed=2)
        with torch.no_grad():
            self.ref_emb = torch.nn.functional.normalize(self.emb.eval()(self.trunk.eval()(self.db)), dim=1)

    def test_point_similarity_equals_point_map_plus_bias(self):
        # F_ij · E^r / Z = (Σ_xy I_ij(x, y) + F_ij · B^r) / Z  (stride-1 features: pixel (2, 3) = cell (2, 3))
        fq, fr = self.dec.fold_query(self.q), self.dec.fold_reference(self.db)
        s = self.psr.scores(self.q, (2, 3), self.ref_emb)
        pmap = self.dec.point_specific(fq, fr, [(2, 3)], coordinates="feature", scale="dot")[:, 0]
        z = fq.embedding.norm() * fr.embedding.norm(dim=1)
        expected = (pmap.sum(dim=(1, 2)) + fr.bias @ fq.features[0, 2, 3]) / z
        torch.testing.assert_close(s, expected, rtol=1e-12, atol=1e-14)

    def test_whole_image_roi_is_the_query_without_its_bias(self):
        # a mask covering every cell: the mean of F_ij = (E^q - B^q) / (h w)
        fq = self.dec.fold_query(self.q)
        f, norm = self.psr.roi_embedding(self.q, np.ones((5, 6), dtype=bool))
        torch.testing.assert_close(f, (fq.embedding[0] - fq.bias[0]) / 30)
        torch.testing.assert_close(norm, fq.embedding[0].norm())
        box, _ = self.psr.roi_embedding(self.q, (0, 0, 6, 5))
        torch.testing.assert_close(box, f)

    def test_search_matches_scores(self):
        s = self.psr.scores(self.q, (1, 1), self.ref_emb)
        vals, idx = self.psr.search(self.q, (1, 1), self.ref_emb, k=3)
        torch.testing.assert_close(idx, torch.argsort(s, descending=True)[:3])
        torch.testing.assert_close(vals.double(), s[idx], rtol=1e-5, atol=1e-6)

    def test_bad_inputs(self):
        with self.assertRaisesRegex(ValueError, "reference set size"):
            self.psr.search(self.q, (1, 1), self.ref_emb, k=7)
        with self.assertRaisesRegex(ValueError, "outside the image"):
            self.psr.scores(self.q, (5, 0), self.ref_emb)
        with self.assertRaisesRegex(ValueError, "empty"):
            self.psr.scores(self.q, np.zeros((5, 6), dtype=bool), self.ref_emb)
        with self.assertRaisesRegex(ValueError, "shape"):
            self.psr.scores(self.q, np.ones((4, 6), dtype=bool), self.ref_emb)
        with self.assertRaisesRegex(ValueError, "ref_emb"):
            self.psr.scores(self.q, (1, 1), self.ref_emb[:, :3])
        with self.assertRaisesRegex(ValueError, "one image"):
            self.psr.scores(images(2), (1, 1), self.ref_emb)
        with self.assertRaisesRegex(TypeError, "ActivationDecomposition"):
            PartialSimilarityRetrieval(self.trunk)


if __name__ == "__main__":
    unittest.main()
