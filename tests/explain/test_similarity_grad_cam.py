import unittest

import torch
from torch import nn

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from pml_extensions.explain.similarity_grad_cam import SimilarityGradCAM
from tests.explain.explain_testing_utils import (
    hook_count,
    images,
    linear_gap_model,
    make_model,
    training_flags,
)


class TestSimilarityGradCAM(unittest.TestCase):
    def test_no_norm_equals_decomposition_bias_for_gap_linear(self):
        # Paper Sec. V: with GAP + linear, ∂(E^q·E^r)/∂A_ijk = (W^T E^r)_k / (hw) for every (i, j), so
        # Σ_k α_k A_ijk = F_ij · E^r = "Decomposition+Bias" (un-normalised).
        trunk, emb = linear_gap_model("gap")
        q, r = images(3, seed=1), images(3, seed=2)
        dec = ActivationDecomposition(trunk, emb).overall_maps(q, r, bias=True, scale="dot")
        cam = SimilarityGradCAM(trunk, emb)
        g = cam.maps(q, r, variant="dot", relu=False)
        torch.testing.assert_close(g["query"], dec["query"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g["reference"], dec["reference"], rtol=1e-12, atol=1e-14)
        g_relu = cam.maps(q, r, variant="dot")
        torch.testing.assert_close(g_relu["query"], torch.relu(dec["query"]), rtol=1e-12, atol=1e-14)

    def test_gmp_differs_but_rectified_matches(self):
        trunk, emb = linear_gap_model("gmp")
        q, r = images(2, seed=3), images(2, seed=4)
        dec = ActivationDecomposition(trunk, emb).overall_maps(q, r, bias=True, scale="dot")
        cam = SimilarityGradCAM(trunk, emb)
        g = cam.maps(q, r, variant="dot", relu=False)
        self.assertGreater(float((g["query"] - dec["query"]).abs().max()), 1e-3)
        rg = cam.maps(q, r, variant="rectified", relu=False)
        torch.testing.assert_close(rg["query"], dec["query"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(rg["reference"], dec["reference"], rtol=1e-12, atol=1e-14)

    def test_cosine_has_self_direction_term(self):
        # ∂S/∂E^q = (E^r/‖E^r‖ − S E^q/‖E^q‖)/‖E^q‖ (paper Appendix A): with GAP + linear the map is F_ij ·
        # that vector.
        trunk, emb = linear_gap_model("gap")
        q, r = images(2, seed=5), images(2, seed=6)
        dec = ActivationDecomposition(trunk, emb)
        fq, fr = dec.fold_query(q), dec.fold_reference(r)
        eq, er = fq.embedding, fr.embedding
        s = nn.functional.cosine_similarity(eq, er)
        direction = (er / er.norm(dim=1, keepdim=True) - s[:, None] * eq / eq.norm(dim=1, keepdim=True)) / eq.norm(
            dim=1, keepdim=True
        )
        expected = torch.einsum("nijl,nl->nij", fq.features, direction)
        g = SimilarityGradCAM(trunk, emb).maps(q, r, variant="cosine", relu=False)
        torch.testing.assert_close(g["query"], expected, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g["similarity"], s)

    def test_repeated_calls_identical_and_no_grad_accumulation(self):
        trunk, emb = make_model("gmp")
        q, r = images(2, seed=7), images(2, seed=8)
        cam = SimilarityGradCAM(trunk, emb)
        first = {v: cam.maps(q, r, variant=v) for v in ("cosine", "dot", "rectified")}
        second = {v: cam.maps(q, r, variant=v) for v in ("dot", "rectified", "cosine")}
        for v in first:
            torch.testing.assert_close(first[v]["query"], second[v]["query"], rtol=0, atol=0)
            self.assertFalse(first[v]["query"].requires_grad)
        for p in list(trunk.parameters()) + list(emb.parameters()):
            self.assertIsNone(p.grad)

    def test_query_broadcast_against_top_k(self):
        trunk, emb = linear_gap_model("gap")
        q, refs = images(1, seed=9), images(3, seed=10)
        cam = SimilarityGradCAM(trunk, emb)
        g = cam.maps(q, refs, variant="cosine", relu=False)
        for n in range(3):
            single = cam.maps(q, refs[n : n + 1], variant="cosine", relu=False)
            torch.testing.assert_close(single["query"][0], g["query"][n])

    def test_hooks_and_modes_after_success_and_exception(self):
        trunk, emb = make_model("gap")
        trunk.train()
        flags = training_flags(trunk, emb)
        cam = SimilarityGradCAM(trunk, emb)
        cam.maps(images(1), images(1))
        self.assertEqual(hook_count(trunk, emb), 0)
        self.assertEqual(training_flags(trunk, emb), flags)

        class Boom(nn.Module):
            def forward(self, x):
                raise RuntimeError("boom")

        bad = SimilarityGradCAM(trunk, Boom())
        with self.assertRaisesRegex(RuntimeError, "boom"):
            bad.maps(images(1), images(1))
        self.assertEqual(hook_count(trunk, emb), 0)
        self.assertEqual(training_flags(trunk, emb), flags)

    def test_inference_mode_is_named_in_one_line(self):
        # issue 22, the exact case: this ended with PyTorch's "element 0 of tensors does not require grad and does
        # not have a grad_fn"
        trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        cam = SimilarityGradCAM(trunk, nn.Linear(4, 5))
        flags = training_flags(trunk)
        with torch.inference_mode():
            with self.assertRaises(RuntimeError) as caught:
                cam.attribute(torch.rand(2, 3, 10, 12), torch.rand(2, 3, 10, 12))
        message = str(caught.exception)
        self.assertEqual(message.count("\n"), 0)
        self.assertIn("SimilarityGradCAM", message)
        self.assertIn("torch.inference_mode()", message)
        self.assertIn("call it outside inference_mode", message)
        self.assertEqual(hook_count(trunk), 0)
        self.assertEqual(training_flags(trunk), flags)
        # torch.no_grad() is fine (the call switches gradients on), and so are images made under inference_mode
        q, r = torch.rand(2, 3, 10, 12), torch.rand(2, 3, 10, 12)
        expected = cam.attribute(q, r)
        with torch.no_grad():
            torch.testing.assert_close(cam.attribute(q, r), expected)
        with torch.inference_mode():
            q_inf, r_inf = q.clone(), r.clone()
        torch.testing.assert_close(cam.attribute(q_inf, r_inf), expected)

    def test_bad_inputs(self):
        trunk, emb = make_model("gap")
        cam = SimilarityGradCAM(trunk, emb)
        with self.assertRaisesRegex(ValueError, "variant"):
            cam.maps(images(1), images(1), variant="gradcam++")
        with self.assertRaisesRegex(ValueError, "same size"):
            cam.maps(images(2), images(3))

        class Norm(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return nn.functional.normalize(self.inner(x), dim=1)

        with self.assertRaisesRegex(ValueError, "pre-normalisation"):
            SimilarityGradCAM(trunk, Norm(emb)).maps(images(1), images(1), variant="dot")
        # the cosine variant does not need it
        SimilarityGradCAM(trunk, Norm(emb)).maps(images(1), images(1), variant="cosine")


if __name__ == "__main__":
    unittest.main()
