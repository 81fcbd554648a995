import unittest

import torch
from torch import nn

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from tests.explain.explain_testing_utils import hook_count, images, make_model
from tests.explain.test_head_folder import arange_model


def loop_point_to_point(Fq, Fr):
    """The four nested loops of the authors' demo, one dot product per (i, j, x, y)."""
    h, w, _ = Fq.shape
    h2, w2, _ = Fr.shape
    D = torch.zeros(h, w, h2, w2, dtype=Fq.dtype)
    for i in range(h):
        for j in range(w):
            for x in range(h2):
                for y in range(w2):
                    D[i, j, x, y] = torch.dot(Fq[i, j], Fr[x, y])
    return D


class TestActivationDecomposition(unittest.TestCase):
    def test_hand_computed_maps(self):
        trunk, lin, x = arange_model()
        dec = ActivationDecomposition(trunk, lin)
        # F = [[2, 2.75], [3.5, 4.25]] (test_head_folder), Σ F = 12.5, B = 3, E = 15.5
        m = dec.overall_maps(x, x, scale="dot")
        F = torch.tensor([[2.0, 2.75], [3.5, 4.25]], dtype=torch.float64)
        torch.testing.assert_close(m["query"][0], F * 12.5)
        torch.testing.assert_close(m["reference"][0], F * 12.5)
        mb = dec.overall_maps(x, x, scale="dot", bias=True)
        torch.testing.assert_close(mb["query"][0], F * 15.5)
        torch.testing.assert_close(m["dot"], torch.tensor([15.5**2], dtype=torch.float64))
        torch.testing.assert_close(m["similarity"], torch.tensor([1.0], dtype=torch.float64))
        D = dec.point_to_point(x, x)
        torch.testing.assert_close(D[0, 0, 1, 1, 1], torch.tensor(2.75 * 4.25, dtype=torch.float64))

    def test_sum_of_terms_equals_dot_and_cosine(self):
        for pool in ("gap", "gmp", "flatten"):
            with self.subTest(pool=pool):
                trunk, emb = make_model(pool)
                q, r = images(3, seed=1), images(3, seed=2)
                dec = ActivationDecomposition(trunk, emb)
                fq, fr = dec.fold_query(q), dec.fold_reference(r)
                D = dec.point_to_point(fq, fr)
                total = (
                    D.sum(dim=(1, 2, 3, 4))
                    + (fq.features.sum(dim=(1, 2)) * fr.bias).sum(1)
                    + (fq.bias * fr.features.sum(dim=(1, 2))).sum(1)
                    + (fq.bias * fr.bias).sum(1)
                )
                with torch.no_grad():
                    eq, er = emb.eval()(trunk.eval()(q)), emb(trunk(r))
                torch.testing.assert_close(total, (eq * er).sum(1), rtol=1e-12, atol=1e-12)
                z = eq.norm(dim=1) * er.norm(dim=1)
                torch.testing.assert_close(total / z, nn.functional.cosine_similarity(eq, er), rtol=1e-12, atol=1e-12)
                Dc = dec.point_to_point(fq, fr, scale="cosine")
                torch.testing.assert_close(Dc, D / z.view(-1, 1, 1, 1, 1))

    def test_overall_map_sums(self):
        trunk, emb = make_model("gmp")
        q, r = images(2, seed=3), images(2, seed=4)
        dec = ActivationDecomposition(trunk, emb)
        fq, fr = dec.fold_query(q), dec.fold_reference(r)
        mb = dec.overall_maps(fq, fr, bias=True, scale="dot")
        # Decomposition+Bias query map sums to (E^q - B^q) · E^r
        torch.testing.assert_close(mb["query"].sum(dim=(1, 2)), ((fq.embedding - fq.bias) * fr.embedding).sum(1))
        torch.testing.assert_close(mb["reference"].sum(dim=(1, 2)), ((fr.embedding - fr.bias) * fq.embedding).sum(1))
        m = dec.overall_maps(fq, fr, scale="dot")
        D = dec.point_to_point(fq, fr)
        torch.testing.assert_close(m["query"], D.sum(dim=(3, 4)))
        torch.testing.assert_close(m["reference"], D.sum(dim=(1, 2)))
        mc = dec.overall_maps(fq, fr)  # default: cosine scale
        z = fq.embedding.norm(dim=1) * fr.embedding.norm(dim=1)
        torch.testing.assert_close(mc["query"], m["query"] / z.view(-1, 1, 1))

    def test_vectorised_equals_loop_on_3x3(self):
        trunk, emb = make_model("gap")
        q, r = images(1, size=(3, 3), seed=5), images(1, size=(3, 3), seed=6)
        dec = ActivationDecomposition(trunk, emb)
        fq, fr = dec.fold_query(q), dec.fold_reference(r)
        D = dec.point_to_point(fq, fr)
        self.assertEqual(tuple(D.shape), (1, 3, 3, 3, 3))
        torch.testing.assert_close(D[0], loop_point_to_point(fq.features[0], fr.features[0]), rtol=1e-14, atol=1e-14)

    def test_point_specific(self):
        trunk, emb = make_model("gap")
        q, r = images(2, seed=7), images(2, seed=8)
        dec = ActivationDecomposition(trunk, emb)
        m = dec.overall_maps(q, r, scale="dot")
        ps = dec.point_specific(q, r, [(1, 2), (4, 5)], coordinates="feature", scale="dot")
        self.assertEqual(tuple(ps.shape), (2, 2, 5, 6))
        torch.testing.assert_close(ps.sum(dim=(2, 3))[:, 0], m["query"][:, 1, 2])
        torch.testing.assert_close(ps.sum(dim=(2, 3))[:, 1], m["query"][:, 4, 5])
        # stride-1 features: image pixel (y, x) is feature cell (y, x)
        pi = dec.point_specific(q, r, [(1.0, 2.0)], scale="dot")
        torch.testing.assert_close(pi[:, 0], ps[:, 0])
        # half-way between two cells: the mean of the two maps (bilinear)
        ph = dec.point_specific(q, r, [(1.0, 2.5)], scale="dot")
        p3 = dec.point_specific(q, r, [(1, 3)], coordinates="feature", scale="dot")
        torch.testing.assert_close(ph[:, 0], (ps[:, 0] + p3[:, 0]) / 2)

    def test_point_specific_bilinear_on_strided_model(self):
        trunk, emb = make_model("gap")
        x = images(1, size=(10, 12), seed=9)
        big = nn.Sequential(nn.AvgPool2d(2), trunk).double()  # stride 2 -> 5 x 6 features
        dec = ActivationDecomposition(big, emb)
        # pixel (2.5, 6.5) lies at the centre of feature cell (1, 3): u = (2.5 + .5) * 5/10 - .5 = 1, v = 7
        # * 6/12 - .5 = 3
        pi = dec.point_specific(x, x, [(2.5, 6.5)])
        pf = dec.point_specific(x, x, [(1, 3)], coordinates="feature")
        torch.testing.assert_close(pi, pf)
        up = dec.point_specific(x, x, [(0, 0)], output_size="image")
        self.assertEqual(tuple(up.shape), (1, 1, 10, 12))

    def test_query_against_top_k_and_two_models(self):
        student, emb_s = make_model("gap", seed=0)
        teacher, emb_t = make_model("gmp", seed=1)
        q, refs = images(1, seed=10), images(4, seed=11)
        dec = ActivationDecomposition(student, emb_s, reference_trunk=teacher, reference_embedder=emb_t)
        m = dec.overall_maps(q, refs, scale="dot")
        self.assertEqual(tuple(m["query"].shape), (4, 5, 6))
        with torch.no_grad():
            eq, er = emb_s.eval()(student.eval()(q)), emb_t.eval()(teacher.eval()(refs))
        torch.testing.assert_close(m["dot"], (eq * er).sum(1))
        for n in range(4):
            single = dec.overall_maps(q, refs[n : n + 1], scale="dot")
            torch.testing.assert_close(single["query"][0], m["query"][n])
        self.assertEqual(hook_count(student, emb_s, teacher, emb_t), 0)

    def test_relu_then_sum_option(self):
        trunk, emb = make_model("gap")
        q, r = images(2, seed=12), images(2, seed=13)
        dec = ActivationDecomposition(trunk, emb)
        D = dec.point_to_point(q, r, scale="cosine")
        m = dec.overall_maps(q, r, relu_then_sum=True)
        torch.testing.assert_close(m["query"], torch.relu(D).sum(dim=(3, 4)))
        with self.assertRaisesRegex(ValueError, "relu_then_sum"):
            dec.overall_maps(q, r, relu_then_sum=True, bias=True)

    def test_normalisation_and_upsampling_options(self):
        trunk, emb = make_model("gap")
        q, r = images(2, seed=14), images(2, seed=15)
        dec = ActivationDecomposition(trunk, emb)
        m = dec.overall_maps(q, r, normalize="minmax", output_size=(10, 12))
        self.assertEqual(tuple(m["query"].shape), (2, 10, 12))
        self.assertGreaterEqual(float(m["query"].min()), 0.0)
        self.assertLessEqual(float(m["query"].max()), 1.0 + 1e-12)
        t2, e2 = make_model("flatten")
        signed = ActivationDecomposition(t2, e2).overall_maps(q, r)
        self.assertTrue(bool((signed["query"] < 0).any()))  # maps keep their sign by default
        self.assertTrue(bool((signed["query"] > 0).any()))

    def test_bad_inputs(self):
        trunk, emb = make_model("gap")
        dec = ActivationDecomposition(trunk, emb)
        with self.assertRaisesRegex(ValueError, "outside the image"):
            dec.point_specific(images(1), images(1), [(5, 0)])
        with self.assertRaisesRegex(ValueError, "outside the feature map"):
            dec.point_specific(images(1), images(1), [(0, 6)], coordinates="feature")
        with self.assertRaisesRegex(ValueError, "same size"):
            dec.overall_maps(images(2), images(3))
        with self.assertRaisesRegex(ValueError, "scale"):
            dec.overall_maps(images(1), images(1), scale="euclidean")
        with self.assertRaisesRegex(TypeError, "query_images"):
            dec.overall_maps("x", images(1))
        t2, e2 = make_model("gap", out_dim=3)
        with self.assertRaisesRegex(ValueError, "width"):
            ActivationDecomposition(trunk, emb, reference_trunk=t2, reference_embedder=e2).overall_maps(
                images(1), images(1)
            )
        self.assertEqual(hook_count(trunk, emb), 0)

    def test_float32(self):
        trunk, emb = make_model("gap", dtype=torch.float32)
        q, r = images(2, dtype=torch.float32), images(2, seed=3, dtype=torch.float32)
        m = ActivationDecomposition(trunk, emb).overall_maps(q, r, bias=True)
        self.assertEqual(m["query"].dtype, torch.float32)


if __name__ == "__main__":
    unittest.main()
