import copy
import re
import unittest

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners

from pml_extensions.losses import XMLWrapper
from pml_extensions.trunks import HistogramPooling
from tests.testing_utils import angle_to_coord, simplex_rows

LABELS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])


def inner_losses():
    return {
        "contrastive": pml_losses.ContrastiveLoss(),
        "triplet": pml_losses.TripletMarginLoss(margin=0.3),
        "multi_similarity": pml_losses.MultiSimilarityLoss(),
        "proxy_anchor": pml_losses.ProxyAnchorLoss(num_classes=4, embedding_size=3),
    }


def batch(seed=0, n=8, d=3, m=5):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, d, generator=g, dtype=torch.float64)
    return emb, simplex_rows(n, m, seed=seed)


class TestXMLWeightZero(unittest.TestCase):
    def test_equals_inner_loss_value_and_gradients(self):
        for name, inner in inner_losses().items():
            with self.subTest(loss=name):
                inner = inner.double()
                reference = copy.deepcopy(inner)
                emb, hist = batch()
                e1 = emb.clone().requires_grad_()
                e2 = emb.clone().requires_grad_()
                h1 = hist.clone().requires_grad_()
                out = XMLWrapper(inner, xml_weight=0)(e1, LABELS, histograms=h1)
                ref = reference(e2, LABELS)
                self.assertEqual(out.item(), ref.item())
                out.backward()
                ref.backward()
                self.assertTrue(torch.equal(e1.grad, e2.grad))
                self.assertIsNone(h1.grad)
                for p, q in zip(inner.parameters(), reference.parameters()):
                    self.assertTrue(torch.equal(p.grad, q.grad))

    def test_prototypes_get_gradient_only_from_xml_term(self):
        torch.manual_seed(0)
        for weight, expect_grad in ((0.0, False), (0.5, True)):
            pool = HistogramPooling(6, 4).double()
            embedder = torch.nn.Linear(6, 3).double()
            feats = torch.randn(8, 6, 3, 3, dtype=torch.float64)
            loss = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=weight, histogram_layer=pool)
            out = loss(embedder(pool(feats)), LABELS)
            out.backward()
            grad = pool.prototype_conv.weight.grad
            has_grad = grad is not None and bool(grad.abs().sum() > 0)
            self.assertEqual(has_grad, expect_grad, f"xml_weight={weight}")


class TestXMLTerm(unittest.TestCase):
    def test_exactly_linear_embeddings_are_predicted_exactly(self):
        # Y = Z A with Z of full column rank on each half (4 rows, m = 3) and a tiny ridge: the prototypes fitted on
        # one half are A, so each half is predicted exactly, and L_XML = loss(Y_1) + loss(Y_2).
        m = 3
        hist = simplex_rows(8, m, seed=3)
        a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]], dtype=torch.float64)
        emb = hist @ a
        wrapper = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=0.25, ridge=1e-12, seed=5)
        halves = torch.Generator().manual_seed(5)
        from pml_extensions.utils import class_disjoint_split

        first, second = class_disjoint_split(LABELS, halves)
        pred1, pred2 = wrapper.cross_predictions(emb, hist, (first, second))
        torch.testing.assert_close(pred1, emb[first], rtol=0, atol=1e-8)
        torch.testing.assert_close(pred2, emb[second], rtol=0, atol=1e-8)
        total = wrapper(emb, LABELS, histograms=hist)
        inner = pml_losses.ContrastiveLoss()
        expected = inner(emb, LABELS) + 0.25 * (inner(emb[first], LABELS[first]) + inner(emb[second], LABELS[second]))
        torch.testing.assert_close(total, expected, rtol=0, atol=1e-7)
        self.assertAlmostEqual(float(wrapper.xml_loss), float((expected - inner(emb, LABELS)) / 0.25), places=6)

    def test_each_half_predicted_from_the_other_half(self):
        # The fit on half 2 alone must produce half 1's prediction: changing half 1's embeddings leaves it unchanged.
        emb, hist = batch(1)
        wrapper = XMLWrapper(pml_losses.ContrastiveLoss())
        halves = (torch.tensor([0, 1, 4, 5]), torch.tensor([2, 3, 6, 7]))
        p1, p2 = wrapper.cross_predictions(emb, hist, halves)
        changed = emb.clone()
        changed[halves[0]] += 10.0
        q1, q2 = wrapper.cross_predictions(changed, hist, halves)
        torch.testing.assert_close(p1, q1)
        self.assertFalse(torch.allclose(p2, q2))

    def test_hand_computed_tiny_case(self):
        # Four unit vectors at 0, 90, 180, 270 degrees and one prototype (m = 1, every histogram = [1]), ridge 1.
        # Singleton classes give no positive pair on either side: the XML term is skipped, counted, and the output
        # is the inner loss alone (never NaN).
        emb = angle_to_coord([0, 90, 180, 270])
        labels = torch.tensor([0, 1, 2, 3])
        wrapper = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=1.0, ridge=1.0)
        out = wrapper(emb, labels, histograms=torch.ones(4, 1, dtype=torch.float64))
        self.assertEqual(wrapper.num_skipped_xml, 1)
        torch.testing.assert_close(out, pml_losses.ContrastiveLoss()(emb, labels))
        # Labels [0, 0, 1, 1] -> halves {class 0} and {class 1}. With m = 1 the ridge fit is V_k = (sum of half k)/3,
        # and both rows of a half are predicted by the same vector V_other: one positive pair at distance 0,
        # contrastive loss 0 per half. So L_XML = 0 and the total equals the inner loss exactly.
        labels = torch.tensor([0, 0, 1, 1])
        wrapper = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=1.0, ridge=1.0)
        out = wrapper(emb, labels, histograms=torch.ones(4, 1, dtype=torch.float64))
        self.assertEqual(float(wrapper.xml_loss), 0.0)
        torch.testing.assert_close(out, pml_losses.ContrastiveLoss()(emb, labels))

    def test_gradients_reach_embeddings_histograms_and_proxies(self):
        emb, hist = batch(2)
        emb.requires_grad_()
        hist.requires_grad_()
        inner = pml_losses.ProxyAnchorLoss(num_classes=4, embedding_size=3).double()
        out = XMLWrapper(inner, xml_weight=1.0)(emb, LABELS, histograms=hist)
        out.backward()
        self.assertGreater(float(hist.grad.abs().sum()), 0)
        self.assertGreater(float(emb.grad.abs().sum()), 0)
        self.assertGreater(float(inner.proxies.grad.abs().sum()), 0)

    def test_with_miner(self):
        emb, hist = batch(4)
        miner = miners.MultiSimilarityMiner()
        it = miner(emb, LABELS)
        wrapper = XMLWrapper(pml_losses.TripletMarginLoss(margin=0.5), xml_weight=0.1)
        out = wrapper(emb, LABELS, it, histograms=hist)
        self.assertTrue(torch.isfinite(out))
        triplets = miners.TripletMarginMiner(margin=0.5)(emb, LABELS)
        out = wrapper(emb, LABELS, triplets, histograms=hist)
        self.assertTrue(torch.isfinite(out))

    def test_split_reproducible_with_seed(self):
        emb, hist = batch(6)
        a = [XMLWrapper(pml_losses.ContrastiveLoss(), seed=3)(emb, LABELS, histograms=hist) for _ in range(2)]
        self.assertEqual(a[0].item(), a[1].item())

    def test_autocast_keeps_solve_in_float32(self):
        emb, hist = batch(7)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=1.0)(emb.float(), LABELS, histograms=hist.float())
        self.assertTrue(torch.isfinite(out))

    def test_histograms_from_layer_and_recorded_attributes(self):
        pool = HistogramPooling(5, 4)
        feats = torch.randn(8, 5, 2, 2)
        emb = torch.nn.Linear(5, 3)(pool(feats))
        wrapper = XMLWrapper(pml_losses.ContrastiveLoss(), histogram_layer=pool)
        out = wrapper(emb, LABELS)
        self.assertTrue(torch.isfinite(out))
        for name in ("inner_loss", "xml_loss", "num_skipped_xml", "xml_weight", "ridge"):
            self.assertIn(name, wrapper._record_these)
        self.assertGreater(float(wrapper.xml_loss), 0)


class TestXMLBadInput(unittest.TestCase):
    def test_errors_name_the_argument(self):
        emb, hist = batch()
        loss = XMLWrapper(pml_losses.ContrastiveLoss())
        bad = emb.clone()
        bad[0, 0] = float("nan")
        with self.assertRaisesRegex(ValueError, "embeddings.*NaN"):
            loss(bad, LABELS, histograms=hist)
        bad[0, 0] = float("inf")
        with self.assertRaisesRegex(ValueError, "embeddings.*inf"):
            loss(bad, LABELS, histograms=hist)
        bad_hist = hist.clone()
        bad_hist[1, 1] = float("nan")
        with self.assertRaisesRegex(ValueError, "histograms"):
            loss(emb, LABELS, histograms=bad_hist)
        with self.assertRaisesRegex(ValueError, "histograms has batch size 7 but embeddings has 8"):
            loss(emb, LABELS, histograms=hist[:7])
        with self.assertRaisesRegex(ValueError, "histogram_layer"):
            loss(emb, LABELS)
        with self.assertRaisesRegex(TypeError, "loss must be"):
            XMLWrapper(torch.nn.ReLU())
        with self.assertRaisesRegex(TypeError, "loss must be"):
            XMLWrapper("ContrastiveLoss")
        with self.assertRaisesRegex(ValueError, "xml_weight"):
            XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=-0.1)
        with self.assertRaisesRegex(ValueError, "ridge"):
            XMLWrapper(pml_losses.ContrastiveLoss(), ridge=-1)
        with self.assertRaisesRegex(ValueError, "ridge"):
            XMLWrapper(pml_losses.ContrastiveLoss(), ridge=0)
        with self.assertRaisesRegex(ValueError, "labels"):
            loss(emb, LABELS[:5], histograms=hist)

    def test_stale_histograms_from_layer_are_an_error(self):
        pool = HistogramPooling(5, 4)
        pool(torch.randn(4, 5, 2, 2))
        with self.assertRaisesRegex(
            ValueError, "histogram_layer.last_histograms has batch size 4 but embeddings has 8"
        ):
            XMLWrapper(pml_losses.ContrastiveLoss(), histogram_layer=pool)(torch.randn(8, 3), LABELS)


# ------------------------------------------------------------ half precision: the lift keeps `ref_emb is embeddings`
#: every PML loss that accepts no separate reference set: it checks ``ref_emb is embeddings`` (and ``ref_labels is
#: labels``), which PML's own tests pass (``loss(embeddings, labels, ref_emb=embeddings, ref_labels=labels)``)
NO_REFERENCE_SET = {
    "ArcFaceLoss": dict(num_classes=4, embedding_size=8),
    "CosFaceLoss": dict(num_classes=4, embedding_size=8),
    "FastAPLoss": {},
    "HistogramLoss": dict(n_bins=10),
    "InstanceLoss": {},
    "LargeMarginSoftmaxLoss": dict(num_classes=4, embedding_size=8),
    "ManifoldLoss": dict(l=8, K=4),
    "NPairsLoss": {},
    "NormalizedSoftmaxLoss": dict(num_classes=4, embedding_size=8),
    "P2SGradLoss": dict(descriptors_dim=8, num_classes=4),
    "PNPLoss": {},
    "ProxyAnchorLoss": dict(num_classes=4, embedding_size=8),
    "ProxyNCALoss": dict(num_classes=4, embedding_size=8),
    "RankedListLoss": dict(margin=0.4, Tn=0.1),
    "SmoothAPLoss": {},
    "SoftTripleLoss": dict(num_classes=4, embedding_size=8, centers_per_class=2),
    "SphereFaceLoss": dict(num_classes=4, embedding_size=8),
    "SubCenterArcFaceLoss": dict(num_classes=4, embedding_size=8),
}


def test_the_table_names_every_pml_loss_that_refuses_a_reference_set():
    import inspect

    refusing = set()
    for name in dir(pml_losses):
        cls = getattr(pml_losses, name)
        if inspect.isclass(cls) and issubclass(cls, torch.nn.Module):
            source = "".join(inspect.getsource(k) for k in cls.__mro__ if k.__module__.startswith("pytorch_metric"))
            if "ref_not_supported" in source:
                refusing.add(name)
    assert refusing == set(NO_REFERENCE_SET)


def _half_batch(dtype, with_labels=True):
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(16, 8, generator=g).to(dtype)
    return emb, torch.arange(4).repeat_interleave(4) if with_labels else None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(NO_REFERENCE_SET))
def test_half_precision_ref_emb_is_embeddings_at_weight_zero_is_the_loss(name, dtype):
    """``XMLWrapper(loss, 0)(emb, labels, ref_emb=emb, ref_labels=labels)`` with float16/bfloat16 ``emb`` raised
    "ref_emb is not supported for this loss function" where the loss itself returns a value; at ``xml_weight=0``
    the wrapper is the loss: the same value and dtype, bit for bit (or the loss's own error, e.g. a CPU kernel
    missing in bfloat16)."""
    torch.manual_seed(0)
    inner = getattr(pml_losses, name)(**NO_REFERENCE_SET[name])
    reference = copy.deepcopy(inner)
    emb, labels = _half_batch(dtype, with_labels=name != "ManifoldLoss")  # ManifoldLoss takes no labels
    torch.manual_seed(2)
    try:
        expected = reference(emb, labels, ref_emb=emb, ref_labels=labels)
    except (RuntimeError, AssertionError) as e:  # the loss's own limit in this dtype, which the wrapper keeps
        with pytest.raises(type(e), match=re.escape(str(e)) if str(e) else None):
            XMLWrapper(inner, xml_weight=0)(emb, labels, ref_emb=emb, ref_labels=labels)
        return
    torch.manual_seed(2)
    out = XMLWrapper(inner, xml_weight=0)(emb, labels, ref_emb=emb, ref_labels=labels)
    assert out.dtype == expected.dtype and torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(set(NO_REFERENCE_SET) - {"ManifoldLoss"}))  # XML needs labels
def test_half_precision_ref_emb_is_embeddings_through_the_lift(name, dtype):
    """With the XML term (``xml_weight > 0``) the embeddings are lifted to float32: ``ref_emb`` that was
    ``embeddings`` is passed on as the lifted embeddings, so the call equals the one without ``ref_emb``."""
    emb, labels = _half_batch(dtype)
    hist = simplex_rows(16, 5, seed=3).to(dtype)
    torch.manual_seed(0)
    with_ref = XMLWrapper(getattr(pml_losses, name)(**NO_REFERENCE_SET[name]), xml_weight=0.5)
    without = copy.deepcopy(with_ref)
    out = with_ref(emb, labels, ref_emb=emb, ref_labels=labels, histograms=hist)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    assert torch.equal(out, without(emb, labels, histograms=hist))
    with pytest.raises(ValueError, match="ref_emb is not supported"):  # a separate reference set stays refused
        with_ref(emb, labels, ref_emb=emb.clone(), ref_labels=labels, histograms=hist)


# ------------------------------------------------------------ calls PML's tests make of a loss, at xml_weight=0
def test_enqueue_mask_goes_to_the_inner_cross_batch_memory():
    cbm = pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), embedding_size=3, memory_size=12)
    reference = copy.deepcopy(cbm)
    wrapped = XMLWrapper(cbm, xml_weight=0)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        emb, labels = torch.randn(8, 3, generator=g), torch.randint(0, 3, (8,), generator=g)
        mask = torch.arange(8) % 2 == 0
        assert torch.equal(wrapped(emb, labels, enqueue_mask=mask), reference(emb, labels, enqueue_mask=mask))
    assert torch.equal(cbm.embedding_memory, reference.embedding_memory) and cbm.queue_idx == reference.queue_idx


def test_labels_none_with_an_indices_tuple_at_weight_zero_only():
    emb = torch.randn(6, 3, generator=torch.Generator().manual_seed(5))
    triplets = (torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5]))
    loss = pml_losses.TripletMarginLoss(margin=5.0)
    assert torch.equal(XMLWrapper(loss, xml_weight=0)(emb, None, triplets), loss(emb, None, triplets))
    with pytest.raises(ValueError, match="labels is None: the XML term splits the batch by class"):
        XMLWrapper(loss, xml_weight=0.1)(emb, None, triplets, histograms=torch.ones(6, 2) / 2)


def test_a_loss_without_labels_is_refused_with_the_xml_term_only():
    """SelfSupervisedLoss takes (embeddings, ref_emb): at xml_weight=0 the wrapper is the loss, with the XML term
    (which splits the batch by class) it is refused at construction."""
    g = torch.Generator().manual_seed(6)
    emb, ref = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    inner = pml_losses.SelfSupervisedLoss(pml_losses.TripletMarginLoss())
    assert torch.equal(XMLWrapper(inner, xml_weight=0)(emb, ref), inner(emb, ref))
    assert torch.equal(XMLWrapper(inner, xml_weight=0)(emb, ref_emb=ref), inner(emb, ref_emb=ref))
    with pytest.raises(
        TypeError, match=r"with xml_weight > 0 not SelfSupervisedLoss, which takes \(embeddings, ref_emb\)"
    ):
        XMLWrapper(inner, xml_weight=0.1)
