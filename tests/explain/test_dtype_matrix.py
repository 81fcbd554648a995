"""Issue 12 item 1 (explanation part): folding and maps × {float32, bfloat16, float16} × {pure, autocast}.

Folds and map sums run in float32 inside for half-precision models (maps are float32); the maps agree with the
float32 model's maps within the stated tolerance (max abs difference / max |float32 map|).
"""

import copy
import unittest

import torch
from torch import nn

from pml_extensions.explain import ActivationDecomposition, SimilarityGradCAM
from pml_extensions.trunks.retrieval_head import RetrievalHead
from tests.explain.explain_testing_utils import images, make_model

# relative tolerances (of max |float32 map|): decomposition / Grad-CAM; Grad-CAM backpropagates through the
# half-precision head, so it is looser
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (3e-2, 1.5e-1),
    torch.float16: (3e-3, 2e-2),
}


def models():
    for pool in ("gap", "gmp"):
        t, e = make_model(pool, dtype=torch.float32)
        yield pool, t, e
    torch.manual_seed(0)  # the test's own module initialisation
    yield "retrieval_head", nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()), RetrievalHead(4, 6)


def rel(a, b):
    return float((a.float() - b).abs().max() / b.abs().max())


class TestDtypeMatrix(unittest.TestCase):
    def test_matrix(self):
        x = images(2, dtype=torch.float32)
        q, r = x[:1], x[1:]
        for name, trunk, emb in models():
            ref = ActivationDecomposition(trunk, emb).overall_maps(q, r, bias=True)
            ref_cam = SimilarityGradCAM(trunk, emb).maps(q, r, relu=False)
            for dtype, (tol_dec, tol_cam) in TOL.items():
                for mode in ("pure", "autocast"):
                    if dtype == torch.float32 and mode == "autocast":
                        continue
                    with self.subTest(model=name, dtype=dtype, mode=mode):
                        if mode == "pure":
                            t, e = copy.deepcopy(trunk).to(dtype), copy.deepcopy(emb).to(dtype)
                            out = ActivationDecomposition(t, e).overall_maps(q.to(dtype), r.to(dtype), bias=True)
                            cam = SimilarityGradCAM(t, e).maps(q.to(dtype), r.to(dtype), relu=False)
                        else:
                            with torch.autocast("cpu", dtype=dtype):
                                out = ActivationDecomposition(trunk, emb).overall_maps(q, r, bias=True)
                                cam = SimilarityGradCAM(trunk, emb).maps(q, r, relu=False)
                        for maps in (out, cam):
                            self.assertEqual(maps["query"].dtype, torch.float32)
                            self.assertTrue(bool(torch.isfinite(maps["query"]).all()))
                            self.assertTrue(bool(torch.isfinite(maps["reference"]).all()))
                        self.assertLessEqual(rel(out["query"], ref["query"]), tol_dec)
                        self.assertLessEqual(rel(out["reference"], ref["reference"]), tol_dec)
                        self.assertLessEqual(abs(float(out["similarity"][0] - ref["similarity"][0])), tol_dec)
                        self.assertLessEqual(rel(cam["query"], ref_cam["query"]), tol_cam)


if __name__ == "__main__":
    unittest.main()
