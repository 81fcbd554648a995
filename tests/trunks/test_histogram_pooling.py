import copy
import math
import unittest

import torch
from torch import nn

from pml_extensions import trunks
from pml_extensions.trunks import HistogramPooling


def _layer(weights, scale=1.0, normalize=False):
    weights = torch.as_tensor(weights, dtype=torch.float64)
    layer = HistogramPooling(weights.shape[1], weights.shape[0], scale=scale, normalize=normalize).double()
    with torch.no_grad():
        layer.prototype_conv.weight.copy_(weights[:, :, None, None])
    return layer


class TestHistogramPooling(unittest.TestCase):
    def test_hand_computed_soft_histogram(self):
        # one image, two positions x1 = (2, 0), x2 = (1, 0); prototypes e1, e2; raw inner products, ε = 1:
        # x1 -> softmax([2, 0]) = [e^2, 1] / (e^2 + 1); x2 -> softmax([1, 0]) = [e, 1] / (e + 1); z' = mean.
        layer = _layer([[1.0, 0.0], [0.0, 1.0]])
        x = torch.tensor([[[[2.0, 1.0]], [[0.0, 0.0]]]], dtype=torch.float64)  # [1, C=2, H=1, W=2]
        gap = layer(x)
        e = math.e
        expected = torch.tensor(
            [[(e**2 / (e**2 + 1) + e / (e + 1)) / 2, (1 / (e**2 + 1) + 1 / (e + 1)) / 2]], dtype=torch.float64
        )
        torch.testing.assert_close(layer.last_histograms, expected, rtol=0, atol=1e-15)
        torch.testing.assert_close(gap, torch.tensor([[1.5, 0.0]], dtype=torch.float64))
        self.assertTrue(layer.last_histograms.requires_grad)

    def test_construction_leaves_the_global_rng_alone_and_honours_device_and_dtype(self):
        before = torch.random.get_rng_state()
        layer = HistogramPooling(8, 5, seed=3, dtype=torch.float64)
        self.assertTrue(torch.equal(torch.random.get_rng_state(), before))
        self.assertEqual(layer.prototype_conv.weight.dtype, torch.float64)
        # the prototypes are N(0, 1/C) draws of the private generator, whatever the device and dtype
        expected = torch.randn(5, 8, generator=torch.Generator().manual_seed(3)) / 8**0.5
        torch.testing.assert_close(layer.prototypes, expected.double(), rtol=0, atol=0)
        with torch.device("meta"):
            self.assertEqual(HistogramPooling(8, 5).prototype_conv.weight.device.type, "meta")

    def test_deepcopy_after_a_forward_pass_with_gradients(self):
        # issue 22, the exact input: this raised "Only Tensors created explicitly by the user (graph leaves) support
        # the deepcopy protocol" because last_histograms / last_pooled hold the forward pass's graph
        m = nn.Sequential(nn.Conv2d(3, 6, 1), trunks.HistogramPooling(6, 4))
        m(torch.rand(2, 3, 4, 4))
        c = copy.deepcopy(m)
        self.assertIsNone(c[1].last_histograms)
        self.assertIsNone(c[1].last_pooled)
        self.assertIsNotNone(m[1].last_histograms.grad_fn)  # the original keeps them for the loss
        torch.testing.assert_close(c.state_dict(), m.state_dict(), rtol=0, atol=0)
        x = torch.rand(2, 3, 4, 4)
        torch.testing.assert_close(c(x), m(x), rtol=0, atol=0)
        torch.testing.assert_close(c[1].last_histograms, m[1].last_histograms, rtol=0, atol=0)

    def test_hand_computed_hard_histogram(self):
        # prototypes (0,0), (10,0); positions (1,0), (2,0), (9,0), (1,1): nearest = 0, 0, 1, 0 -> z* = [3/4, 1/4]
        layer = _layer([[0.0, 0.0], [10.0, 0.0]])
        x = torch.tensor([[1.0, 2.0, 9.0, 1.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64).view(1, 2, 2, 2)
        torch.testing.assert_close(layer.hard_histograms(x), torch.tensor([[0.75, 0.25]], dtype=torch.float64))

    def test_rows_on_simplex_and_large_scale_gives_hard_histogram(self):
        torch.manual_seed(0)
        x = torch.randn(3, 8, 4, 5, dtype=torch.float64)
        for normalize in (True, False):
            layer = HistogramPooling(8, 6, scale=10.0, normalize=normalize).double()
            if not normalize:
                # ε → ∞ gives arg-max of ν·x, which is the nearest prototype (z*) when all prototypes have equal norm
                with torch.no_grad():
                    w = layer.prototype_conv.weight
                    w.div_(w.flatten(1).norm(dim=1)[:, None, None, None])
            z = layer.histograms(x)
            self.assertEqual(z.shape, (3, 6))
            self.assertTrue(bool((z >= 0).all()))
            torch.testing.assert_close(z.sum(dim=1), torch.ones(3, dtype=torch.float64))
            layer.scale = 1e6
            torch.testing.assert_close(layer.histograms(x), layer.hard_histograms(x), rtol=0, atol=1e-6)

    def test_normalised_logits_are_cosines(self):
        layer = _layer([[3.0, 4.0], [0.0, 2.0]], scale=10.0, normalize=True)
        x = torch.tensor([[[[1.0]], [[0.0]]]], dtype=torch.float64)  # feature (1, 0)
        # cosines with (3,4)/5 and (0,1): 0.6 and 0 -> logits 6 and 0
        torch.testing.assert_close(layer.logits(x).flatten(), torch.tensor([6.0, 0.0], dtype=torch.float64))

    def test_output_width_and_gap(self):
        layer = HistogramPooling(16, 4)
        x = torch.randn(2, 16, 3, 3)
        torch.testing.assert_close(layer(x), x.mean(dim=(2, 3)))
        self.assertEqual((layer.num_features, layer.histogram_size, layer.feat_mult()), (16, 4, 1))

    def test_lemma_on_hand_made_features(self):
        # covering radius: features (0,0),(1,0),(4,0); prototypes (0,0),(5,0): distances 0, 1, 1 -> δ = 1
        layer = _layer([[0.0, 0.0], [5.0, 0.0]])
        x = torch.tensor([[0.0, 1.0, 4.0], [0.0, 0.0, 0.0]], dtype=torch.float64).view(1, 2, 1, 3)
        self.assertAlmostEqual(float(layer.covering_radius(x)), 1.0)
        # mean (5/3, 0), z* = [2/3, 1/3], V z* = (5/3, 0) -> error 0 <= δ
        self.assertAlmostEqual(float(layer.gap_reconstruction_error(x)), 0.0, places=12)

    def test_init_methods(self):
        torch.manual_seed(0)
        feats = torch.randn(200, 8)
        for method in ("kmeans", "kcenter", "random"):
            layer = HistogramPooling(8, 5).init_prototypes(feats, method=method, seed=1)
            again = HistogramPooling(8, 5).init_prototypes(feats, method=method, seed=1)
            torch.testing.assert_close(layer.prototypes, again.prototypes)
        # k-center on the normalised features: its covering radius is at most that of random prototypes
        layer = HistogramPooling(8, 16).init_prototypes(feats, method="kcenter")
        rnd = HistogramPooling(8, 16).init_prototypes(feats, method="random")
        x = feats.T.reshape(1, 8, 10, 20)
        self.assertLess(float(layer.covering_radius(x)), float(rnd.covering_radius(x)))

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "num_prototypes"):
            HistogramPooling(8, 0)
        with self.assertRaisesRegex(ValueError, "scale"):
            HistogramPooling(8, 4, scale=0)
        layer = HistogramPooling(8, 4)
        with self.assertRaisesRegex(ValueError, "in_channels=8"):
            layer(torch.randn(2, 7, 3, 3))
        with self.assertRaisesRegex(ValueError, r"\[B, C, H, W\]"):
            layer(torch.randn(2, 8))
        with self.assertRaisesRegex(ValueError, "method"):
            layer.init_prototypes(torch.randn(10, 8), method="spectral")
        with self.assertRaisesRegex(ValueError, "at least num_prototypes"):
            layer.init_prototypes(torch.randn(3, 8), method="kmeans")


class TestLemmaOnTrainedTrunk(unittest.TestCase):
    """Lemma 2.1 (‖GAP − V z*‖ ≤ δ) on local features of a real trained trunk: ImageNet MobileNetV2 on photos."""

    def test_lemma_holds(self):
        try:
            from skimage import data as skdata

            from pml_extensions.trunks import mobilenet_v2_features

            body = mobilenet_v2_features(pretrained=True).eval()
        except (ImportError, FileNotFoundError) as e:  # pragma: no cover - the tox env installs both
            self.skipTest(str(e))
        import torchvision.transforms.functional as TF

        images = [skdata.astronaut(), skdata.coffee(), skdata.chelsea(), skdata.rocket()]
        batch = torch.stack(
            [
                TF.normalize(
                    TF.resize(TF.to_tensor(im), [128, 128], antialias=True),
                    [0.485, 0.456, 0.406],
                    [0.229, 0.224, 0.225],
                )
                for im in images
            ]
        )
        with torch.no_grad():
            feats = body(batch).double()  # [4, 1280, 4, 4]
        for normalize in (True, False):
            for method in ("kcenter", "random"):
                layer = HistogramPooling(1280, 8, normalize=normalize).double()
                layer.init_prototypes(feats, method=method)
                delta = layer.covering_radius(feats)
                err = layer.gap_reconstruction_error(feats)
                self.assertTrue(bool((err <= delta + 1e-9).all()), f"{normalize=} {method=} {err} > {delta}")
                self.assertGreater(float(err.max()), 0)


class TestHistogramPoolingLowPrecision(unittest.TestCase):
    def test_half_zero_column_gives_a_simplex_row_as_in_float32(self):
        # issue 12: HistogramPooling(8, 4).half() with a zero feature at position (0, 0) left last_histograms all NaN
        # (F.normalize's eps 1e-12 is 0 in float16). In float32 the zero feature normalises to 0, its logits are 0
        # and it adds the uniform row 1/4 to the mean; the other 8 positions are as usual.
        torch.manual_seed(0)
        layer = HistogramPooling(8, 4).half()
        x = torch.rand(1, 8, 3, 3, dtype=torch.float16)
        x[:, :, 0, 0] = 0
        out = layer(x)
        self.assertEqual(out.dtype, torch.float16)
        hist = layer.last_histograms
        self.assertTrue(torch.isfinite(hist).all(), hist)
        ref = HistogramPooling(8, 4)
        ref.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
        ref(x.float())
        # same float32 arithmetic inside on the same (float16-representable) numbers: equal to float32 exactly
        self.assertTrue(torch.equal(hist.float(), ref.last_histograms), (hist, ref.last_histograms))
        self.assertAlmostEqual(float(hist.sum()), 1.0, places=6)
        self.assertTrue(bool((hist >= 0).all()))
        self.assertTrue(torch.equal(layer.logits(x)[0, :, 0, 0], torch.zeros(4)))
        # the histogram is the mean of the per-position soft-maxes; position (0, 0) contributes exactly 1/4 each
        per_position = torch.softmax(ref.logits(x.float()), dim=1)
        self.assertTrue(torch.equal(per_position[0, :, 0, 0], torch.full((4,), 0.25)))
        # gradients reach the float16 prototypes and are finite
        hist.sum().backward()
        self.assertTrue(torch.isfinite(layer.prototype_conv.weight.grad).all())


class TestLazyInit(unittest.TestCase):
    """``lazy_init``: prototypes from the local features of the first training forwards (issue 21, item 7)."""

    def _batches(self, n=3, c=6, seed=0):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(4, c, 3, 3, generator=g) for _ in range(n)]

    def test_equals_explicit_init_on_the_first_training_batches(self):
        b1, b2, b3 = self._batches()
        layer = HistogramPooling(6, 5, seed=3, lazy_init="kmeans", lazy_init_batches=2).train()
        random_prototypes = layer.prototypes.detach().clone()
        layer(b1)
        self.assertTrue(layer.lazy_init_pending)  # one batch of two: still the random prototypes
        torch.testing.assert_close(layer.prototypes, random_prototypes, rtol=0, atol=0)
        layer(b2)
        self.assertFalse(layer.lazy_init_pending)
        # 2 x 4 x 3 x 3 = 72 features, fewer than the 10000 kept per batch: all of them, in batch order
        ref = HistogramPooling(6, 5).init_prototypes(
            torch.cat([ref_feats(b) for b in (b1, b2)]), method="kmeans", seed=3
        )
        torch.testing.assert_close(layer.prototypes, ref.prototypes, rtol=0, atol=0)
        # the completing forward already used them; later forwards leave them alone
        torch.testing.assert_close(layer.last_histograms, ref.histograms(b2), rtol=0, atol=0)
        layer(b3)
        torch.testing.assert_close(layer.prototypes, ref.prototypes, rtol=0, atol=0)

    def test_eval_forwards_do_not_count(self):
        (b1,) = self._batches(1)
        layer = HistogramPooling(6, 5, lazy_init="kcenter", lazy_init_batches=1).eval()
        layer(b1)
        self.assertTrue(layer.lazy_init_pending)
        layer.train()(b1)
        self.assertFalse(layer.lazy_init_pending)

    def test_waits_for_enough_features(self):
        # 1 image x 2 x 2 positions = 4 features per batch < 5 prototypes: the second batch completes it
        layer = HistogramPooling(6, 5, lazy_init="kmeans", lazy_init_batches=1)
        layer(torch.randn(1, 6, 2, 2))
        self.assertTrue(layer.lazy_init_pending)
        layer(torch.randn(1, 6, 2, 2))
        self.assertFalse(layer.lazy_init_pending)

    def test_given_prototypes_cancel_it(self):
        b1, b2, _ = self._batches()
        trained = HistogramPooling(6, 5)
        for give in (
            lambda layer: layer.load_state_dict(trained.state_dict()),
            lambda layer: layer.init_prototypes(torch.randn(20, 6), method="kcenter"),
            lambda layer: layer.reset_parameters(),
        ):
            layer = HistogramPooling(6, 5, seed=1, lazy_init="kmeans", lazy_init_batches=1)
            give(layer)
            kept = layer.prototypes.detach().clone()
            layer(b1)
            self.assertFalse(layer.lazy_init_pending)
            torch.testing.assert_close(layer.prototypes, kept, rtol=0, atol=0)

    def test_deterministic_given_seed(self):
        batches = self._batches()
        runs = []
        for _ in range(2):
            layer = HistogramPooling(6, 5, seed=7, lazy_init="kmeans", lazy_init_batches=3)
            for b in batches:
                layer(b)
            runs.append(layer.prototypes.detach().clone())
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)

    def test_keepdim_and_bad_arguments(self):
        x = torch.randn(2, 6, 3, 3)
        out = HistogramPooling(6, 5, keepdim=True)(x)
        torch.testing.assert_close(out, x.mean(dim=(2, 3), keepdim=True))
        with self.assertRaisesRegex(ValueError, "lazy_init must be None or one of"):
            HistogramPooling(6, 5, lazy_init="random")
        with self.assertRaisesRegex(ValueError, "lazy_init_batches must be a positive int"):
            HistogramPooling(6, 5, lazy_init="kmeans", lazy_init_batches=0)


def ref_feats(x):
    """Local features of ``x`` in the normalised comparison space, as the lazy initialisation keeps them."""
    return torch.nn.functional.normalize(x, dim=1).permute(0, 2, 3, 1).reshape(-1, x.shape[1])


def test_kmeans_with_few_features_is_one_note_of_ours_not_faiss_stderr(capfd):
    """720 points for 64 centroids printed faiss's "WARNING clustering ..." on every XML run; the centroids are the
    same without it, and the note (when a log is given) says what to change."""
    feats = torch.randn(100, 8, generator=torch.Generator().manual_seed(0))
    notes = []
    HistogramPooling(8, 5).init_prototypes(feats, method="kmeans", seed=1, log=notes.append)
    HistogramPooling(8, 2).init_prototypes(feats, method="kmeans", seed=1, log=notes.append)  # 100 >= 2 x 39
    assert notes == [
        "note: k-means prototype initialisation: 100 local features for 5 prototypes (faiss recommends >= 39 per "
        "prototype, 195); more or larger images (prototype_init num_batches) give a steadier start"
    ]
    assert "WARNING" not in capfd.readouterr().err


def test_init_from_data_leaves_a_frozen_batchnorm_of_the_body_frozen():
    """A body whose BatchNorm the user froze (``bn.eval()`` inside a training trunk), wrapped in a new Sequential as a
    caller cuts a trunk: after the prototype initialisation the BatchNorm is still in eval mode and its running
    statistics are untouched."""
    import torch

    from pml_extensions.trunks import HistogramPooling

    conv = torch.nn.Conv2d(3, 4, 1)
    bn = torch.nn.BatchNorm2d(4).eval()
    body = torch.nn.Sequential(conv, bn)  # training mode, as every new wrapper
    pool = HistogramPooling(4, 2, seed=0)
    images = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    pool.init_from_data(body, [images], num_batches=1, seed=0)
    assert body.training and conv.training and not bn.training
    body(images)
    assert torch.equal(bn.running_mean, torch.zeros(4)) and int(bn.num_batches_tracked) == 0
