"""Issue 13 items 1-2: GeM, in-forward L2 norm, RetrievalHead, token backbones (ViT, Swin), the fallback."""

import unittest
import warnings

import torch
import torchvision
from torch import nn

from pml_extensions.explain import ActivationDecomposition, HeadFolder, SimilarityGradCAM
from pml_extensions.trunks.gem_pooling import GeMPooling
from pml_extensions.trunks.histogram_pooling import HistogramPooling
from pml_extensions.trunks.retrieval_head import RetrievalHead, l2n
from tests.explain.explain_testing_utils import images


def body(seed=0, channels=4):
    torch.manual_seed(seed)  # the test's own module initialisation
    return nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU()).double()


class InForwardNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        return nn.functional.normalize(self.lin(x), dim=1)


class MeanPooledViT(nn.Module):
    """torchvision ViT trunk whose embedding is the mean of the grid tokens (class token dropped)."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, x):
        v = self.vit
        tokens = v._process_input(x)
        cls = v.class_token.expand(x.shape[0], -1, -1)
        return v.encoder(torch.cat([cls, tokens], dim=1))[:, 1:].mean(dim=1)


class TestGeMAndNorms(unittest.TestCase):
    def test_gem_folds_exactly_for_several_p(self):
        x = images(3)
        for p in (1.0, 2.0, 3.0, 4.5, 10.0):
            with self.subTest(p=p):
                trunk = nn.Sequential(body(), GeMPooling(p=p)).double()
                lin = nn.Linear(4, 5).double()
                f = HeadFolder(trunk, lin)(x)
                with torch.no_grad():
                    expected = lin(trunk(x))
                torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, expected, rtol=1e-12, atol=1e-12)
                self.assertTrue(f.exact)

    def test_gem_weights_by_hand(self):
        # one channel, map [[1, 2], [3, 4]], p = 2: GeM = sqrt(30 / 4); F_ij = x_ij^2 / (4 GeM)
        trunk = nn.Sequential(nn.Identity(), GeMPooling(p=2.0)).double()
        x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=torch.float64)
        f = HeadFolder(trunk)(x)
        gem = (30 / 4) ** 0.5
        expected = torch.tensor([[1.0, 4.0], [9.0, 16.0]], dtype=torch.float64) / (4 * gem)
        torch.testing.assert_close(f.features[0, :, :, 0], expected, rtol=1e-14, atol=0)

    def test_l2_norm_inside_forward(self):
        tr = nn.Sequential(body(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        emb = InForwardNorm().double()
        x = images(2)
        f = HeadFolder(tr, emb)(x)
        self.assertTrue(f.normalised)
        with torch.no_grad():
            torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, emb.lin(tr(x)), rtol=1e-12, atol=1e-12)

    def test_retrieval_head_student_teacher(self):
        # RAML: student at 16 px, teacher at 32 px, both GeM + L2N inside forward + whitening + L2N
        student_body, teacher_body = body(1), body(2)
        student, teacher = RetrievalHead(4, 6, p=3.0).double(), RetrievalHead(4, 6, p=2.5).double()
        q, r = images(2, size=(16, 16), seed=3), images(2, size=(32, 32), seed=4)
        dec = ActivationDecomposition(student_body, student, reference_trunk=teacher_body, reference_embedder=teacher)
        fq, fr = dec.fold_query(q), dec.fold_reference(r)
        for f, b, head, x in ((fq, student_body, student, q), (fr, teacher_body, teacher, r)):
            self.assertTrue(f.normalised and f.exact)
            with torch.no_grad():
                pre = head.whiten(l2n(head.pool(b(x)), head.eps))
            torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, pre, rtol=1e-12, atol=1e-12)
        maps = dec.overall_maps(fq, fr, bias=True, scale="dot")
        self.assertEqual(tuple(maps["query"].shape), (2, 16, 16))
        self.assertEqual(tuple(maps["reference"].shape), (2, 32, 32))
        # Σ_ij F^q_ij · E^r + B^q · E^r = E^q · E^r
        total = maps["query"].sum(dim=(1, 2)) + (fq.bias * fr.embedding).sum(dim=1)
        torch.testing.assert_close(total, maps["dot"], rtol=1e-12, atol=1e-12)
        with torch.no_grad():
            cos = (student(student_body(q)) * teacher(teacher_body(r))).sum(dim=1)
        torch.testing.assert_close(maps["similarity"], cos, rtol=1e-5, atol=1e-5)  # L2N's +1e-6

    def test_histogram_pooling_folds_as_gap(self):
        trunk = nn.Sequential(body(), HistogramPooling(4, 3)).double()
        lin = nn.Linear(4, 5).double()
        x = images(2)
        f = HeadFolder(trunk, lin)(x)
        with torch.no_grad():
            torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, lin(trunk(x)), rtol=1e-12, atol=1e-12)


class TestTokenBackbones(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.vit = torchvision.models.vit_b_16(weights=None, image_size=64).eval()
        cls.vit.heads = nn.Identity()

    def test_mean_pooled_vit_is_exact_over_the_token_grid(self):
        trunk = MeanPooledViT(self.vit)
        x = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        with self.assertWarnsRegex(UserWarning, "encoder.ln"):
            dec = ActivationDecomposition(trunk)
            fq = dec.fold_query(x)
        self.assertEqual(tuple(fq.features.shape), (3, 4, 4, 768))
        maps = dec.overall_maps(fq[0], fq[1:], bias=True, scale="dot")
        total = maps["query"].sum(dim=(1, 2)) + (fq.bias[:1] * fq.embedding[1:]).sum(dim=1)
        with torch.no_grad():
            e = trunk(x)
        dot = (e[:1] * e[1:]).sum(dim=1)
        torch.testing.assert_close(total, dot, rtol=1e-4, atol=0)

    def test_cls_vit_grad_cam_chooses_and_names_the_layer(self):
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
        cam = SimilarityGradCAM(self.vit)
        with self.assertWarnsRegex(UserWarning, "encoder_layer_11.ln_1"):
            maps = cam.attribute(x[:1], x[1:], relu=False)
        self.assertEqual(tuple(maps["query"].shape), (1, 4, 4))
        self.assertTrue(bool((maps["query"] != 0).any()))
        with self.assertRaisesRegex(ValueError, "class-token|class token|SimilarityGradCAM|fallback"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                HeadFolder(self.vit, layer="encoder.ln")(x)

    def test_issue_input_vit_jacobian_fallback_uses_reverse_mode(self):
        # issue 13: forward AD raised NotImplementedError (_scaled_dot_product_flash_attention_for_cpu)
        x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dec = ActivationDecomposition(self.vit, fallback="jacobian")
            f = dec.fold_query(x)
        self.assertFalse(f.exact)
        with torch.no_grad():
            torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, self.vit(x), rtol=1e-4, atol=1e-4)

    def test_autograd_steps_under_inference_mode_name_it_in_one_line(self):
        # issue 22: layer=None on a token model needs one backward pass to tell a class-token read-out from a mean
        # over the grid (without it every ViT would silently look like a class-token head), and the jacobian
        # fallback's reverse mode needs autograd: under inference_mode both raise one line instead
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.inference_mode():
                with self.assertRaisesRegex(RuntimeError, r"^layer=None on a token model \(trunk\.vit\.encoder\.ln\)"):
                    ActivationDecomposition(MeanPooledViT(self.vit)).fold_query(x)
            dec = ActivationDecomposition(self.vit, layer="encoder.layers.encoder_layer_11.ln_1", fallback="jacobian")
            with torch.inference_mode():
                with self.assertRaisesRegex(RuntimeError, r"^fallback='jacobian' .* torch\.inference_mode\(\)"):
                    dec.fold_query(x)

    def test_non_square_token_grid_is_an_error_naming_the_layer(self):
        class Tokens(nn.Module):
            def forward(self, x):
                return x.flatten(2).transpose(1, 2)[:, :7]  # 7 tokens: no square grid

        trunk = nn.Sequential(nn.Conv2d(3, 4, 1), Tokens(), nn.Flatten(), nn.Linear(28, 5))
        with self.assertRaisesRegex(ValueError, r"layer trunk\.1 outputs 7 tokens"):
            SimilarityGradCAM(trunk, layer="1").attribute(torch.rand(1, 3, 4, 4), torch.rand(1, 3, 4, 4))

    def test_swin_channels_last(self):
        torch.manual_seed(0)
        swin = torchvision.models.swin_t(weights=None).eval()
        swin.head = nn.Identity()
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
        f = HeadFolder(swin)(x)  # auto layer: the permuted [N, C, h, w] map before the GAP
        with torch.no_grad():
            torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, swin(x), rtol=1e-4, atol=1e-5)
        maps = SimilarityGradCAM(swin, layer="features.7").attribute(x[:1], x[1:])  # [N, H, W, C] output
        self.assertEqual(tuple(maps["query"].shape), (1, 2, 2))


if __name__ == "__main__":
    unittest.main()
