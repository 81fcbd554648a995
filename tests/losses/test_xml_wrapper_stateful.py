"""XMLWrapper around stateful inner losses (issue 12, item 2): the XML term never changes the inner loss's state."""

import copy
import unittest

import torch
from pytorch_metric_learning import losses as pml_losses

from pml_extensions.losses import XMLWrapper
from pml_extensions.utils.class_split import class_disjoint_split
from tests.testing_utils import simplex_rows

LABELS = torch.arange(8).repeat_interleave(2)  # 16 samples, 8 classes with a positive pair each


def batch(seed=0, n=16, d=4, m=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), simplex_rows(n, m, seed=seed)


def memory_loss(d=4, size=64):
    cbm = pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), embedding_size=d, memory_size=size)
    return cbm.double()


class TestXMLWrapperAroundCrossBatchMemory(unittest.TestCase):
    def test_memory_holds_only_the_real_rows(self):
        # Before the fix one step of 16 samples left 32 rows in the memory, 16 of them predictions.
        emb, hist = batch()
        wrapper = XMLWrapper(memory_loss(), xml_weight=1.0, seed=3)
        wrapper(emb, LABELS, histograms=hist)
        cbm = wrapper.loss
        self.assertEqual(cbm.queue_idx, 16)
        self.assertFalse(cbm.has_been_filled)
        self.assertTrue(torch.equal(cbm.embedding_memory[:16], emb))
        self.assertTrue(torch.equal(cbm.label_memory[:16], LABELS))
        self.assertTrue(torch.equal(cbm.embedding_memory[16:], torch.zeros(48, 4, dtype=torch.float64)))
        # a second step appends the next 16 real rows, nothing else
        emb2, hist2 = batch(seed=1)
        wrapper(emb2, LABELS + 8, histograms=hist2)
        self.assertEqual(cbm.queue_idx, 32)
        self.assertTrue(torch.equal(cbm.embedding_memory[:32], torch.cat([emb, emb2])))
        self.assertTrue(torch.equal(cbm.label_memory[:32], torch.cat([LABELS, LABELS + 8])))

    def test_value_is_memory_term_plus_half_terms_of_the_wrapped_loss(self):
        emb, hist = batch()
        wrapper = XMLWrapper(memory_loss(), xml_weight=0.5, seed=3)
        value = wrapper(emb, LABELS, histograms=hist)
        # reference: a fresh CBM for the inner term; the wrapped ContrastiveLoss alone on each predicted half
        inner = memory_loss()(emb, LABELS)
        halves = class_disjoint_split(LABELS, torch.Generator().manual_seed(3))
        pred1, pred2 = wrapper.cross_predictions(emb, hist, halves)
        plain = pml_losses.ContrastiveLoss()
        xml = plain(pred1, LABELS[halves[0]]) + plain(pred2, LABELS[halves[1]])
        self.assertAlmostEqual(value.item(), (inner + 0.5 * xml).item(), places=12)
        self.assertAlmostEqual(float(wrapper.xml_loss), xml.item(), places=12)

    def test_gradient_flows_and_memory_is_not_in_the_graph(self):
        emb, hist = batch()
        emb.requires_grad_(True)
        hist.requires_grad_(True)
        wrapper = XMLWrapper(memory_loss(), xml_weight=1.0, seed=3)
        wrapper(emb, LABELS, histograms=hist).backward()
        self.assertTrue(torch.isfinite(emb.grad).all() and emb.grad.abs().sum() > 0)
        self.assertTrue(torch.isfinite(hist.grad).all() and hist.grad.abs().sum() > 0)
        self.assertFalse(wrapper.loss.embedding_memory.requires_grad)


class TestCrossBatchMemoryAroundXMLWrapper(unittest.TestCase):
    def test_pml_refuses_it_with_a_clear_message(self):
        with self.assertRaisesRegex(Exception, "CrossBatchMemory not supported for XMLWrapper"):
            pml_losses.CrossBatchMemory(XMLWrapper(pml_losses.ContrastiveLoss()), embedding_size=4)

    def test_a_subclass_that_admits_it_works_as_documented(self):
        class AdmittingMemory(pml_losses.CrossBatchMemory):
            @staticmethod
            def supported_losses():
                return pml_losses.CrossBatchMemory.supported_losses() + ["XMLWrapper"]

        emb, hist = batch()

        class Layer:
            last_histograms = hist

        wrapper = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=1.0, histogram_layer=Layer(), seed=3)
        cbm = AdmittingMemory(wrapper, embedding_size=4, memory_size=64).double()
        value = cbm(emb, LABELS)
        self.assertTrue(torch.isfinite(value))
        self.assertEqual(cbm.queue_idx, 16)  # only the 16 real rows enter the memory
        self.assertTrue(torch.equal(cbm.embedding_memory[:16], emb))
        # the XML term is the batch-only term: the same as XMLWrapper's term on the batch alone
        halves = class_disjoint_split(LABELS, torch.Generator().manual_seed(3))
        pred1, pred2 = wrapper.cross_predictions(emb, hist, halves)
        plain = pml_losses.ContrastiveLoss()
        xml = plain(pred1, LABELS[halves[0]]) + plain(pred2, LABELS[halves[1]])
        self.assertAlmostEqual(float(wrapper.xml_loss), xml.item(), places=12)
        # enqueue_mask: the rows passed on no longer match the histograms -> refused, naming the histograms
        mask = torch.zeros(16, dtype=torch.bool)
        mask[:4] = True
        with self.assertRaisesRegex(ValueError, "batch size 16 but embeddings has 12"):
            cbm(emb, LABELS, enqueue_mask=mask)


class StatefulLoss(torch.nn.Module):
    """A loss with running statistics (BatchNorm), a call counter and a buffer it writes every call."""

    def __init__(self, d=4):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(d, dtype=torch.float64)
        self.inner = pml_losses.ContrastiveLoss()
        self.register_buffer("last_mean", torch.zeros(d, dtype=torch.float64))
        self.calls = 0

    def forward(self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None):
        self.calls += 1
        self.last_mean.copy_(embeddings.detach().mean(dim=0))
        return self.inner(self.norm(embeddings), labels, indices_tuple)


class TestStateOfOtherInnerLosses(unittest.TestCase):
    def test_running_statistics_buffers_and_counters_are_those_of_the_real_term(self):
        emb, hist = batch()
        loss = StatefulLoss()
        reference = copy.deepcopy(loss)
        reference(emb, LABELS)  # the real term alone
        wrapper = XMLWrapper(loss, xml_weight=1.0, seed=3)
        wrapper(emb, LABELS, histograms=hist).backward()
        self.assertEqual(loss.calls, 1)
        self.assertTrue(torch.equal(loss.last_mean, emb.mean(dim=0)))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            self.assertTrue(torch.equal(getattr(loss.norm, name), getattr(reference.norm, name)), name)

    def test_proxies_are_read_not_changed(self):
        emb, hist = batch(d=4)
        proxy = pml_losses.ProxyAnchorLoss(num_classes=8, embedding_size=4).double()
        before = proxy.proxies.detach().clone()
        wrapper = XMLWrapper(proxy, xml_weight=1.0, seed=3)
        wrapper(emb, LABELS, histograms=hist).backward()
        self.assertTrue(torch.equal(proxy.proxies.detach(), before))
        self.assertGreater(proxy.proxies.grad.abs().sum().item(), 0)  # the XML term does train them (documented)


if __name__ == "__main__":
    unittest.main()


class TestNonFiniteHistogramsNameTheirSource(unittest.TestCase):
    def test_message_names_the_layer(self):
        from pml_extensions.trunks import HistogramPooling

        layer = HistogramPooling(4, 3)
        x = torch.rand(16, 4, 2, 2)
        x[0, 0, 0, 0] = float("nan")
        layer(x)
        wrapper = XMLWrapper(pml_losses.ContrastiveLoss(), histogram_layer=layer)
        with self.assertRaisesRegex(ValueError, r"histogram_layer.last_histograms contains NaN .*feature map"):
            wrapper(torch.randn(16, 4), LABELS)
        hist = torch.full((16, 3), float("nan"))
        with self.assertRaisesRegex(ValueError, r"^histograms contains NaN or inf values$"):
            XMLWrapper(pml_losses.ContrastiveLoss())(torch.randn(16, 4), LABELS, histograms=hist)
