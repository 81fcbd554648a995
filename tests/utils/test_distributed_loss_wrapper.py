"""Two gloo processes on CPU: the distributed XML loss equals the single-process loss on the gathered batch."""

import os
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pytorch_metric_learning import losses as pml_losses

from pml_extensions.losses import XMLWrapper
from pml_extensions.trunks import HistogramPooling
from pml_extensions.utils import DistributedLossWrapper

WORLD_SIZE = 2


def make_models():
    torch.manual_seed(0)
    return HistogramPooling(6, 5).double(), torch.nn.Linear(6, 3).double()


def global_batch():
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(16, 6, 3, 3, dtype=torch.float64, generator=g)
    labels = torch.arange(8).repeat_interleave(2)[torch.randperm(16, generator=g)]
    return feats, labels


def _worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    try:
        pool, embedder = make_models()
        feats, labels = global_batch()
        local = slice(rank * 8, (rank + 1) * 8)
        loss_fn = DistributedLossWrapper(XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=0.5, histogram_layer=pool))
        emb = embedder(pool(feats[local]))
        loss = loss_fn(emb, labels[local])
        loss.backward()
        torch.save(
            {"loss": loss.detach(), "xml": loss_fn.loss.xml_loss, "proto_grad": pool.prototype_conv.weight.grad},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


class TestDistributedLossWrapper(unittest.TestCase):
    def test_two_processes_equal_single_process_on_gathered_batch(self):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=WORLD_SIZE, join=True)
            results = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(WORLD_SIZE)]
        pool, embedder = make_models()
        feats, labels = global_batch()
        single = XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=0.5, histogram_layer=pool)
        loss = single(embedder(pool(feats)), labels)
        for r in results:
            # PML's convention: each process returns world_size × the loss on the gathered batch
            torch.testing.assert_close(r["loss"] / WORLD_SIZE, loss.detach(), rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(r["xml"], single.xml_loss, rtol=1e-12, atol=1e-12)
        # the histograms were gathered with the embeddings: the prototypes' gradients summed over processes
        # (what DDP's all-reduce does, before its division by world_size) equal world_size × the single-process one
        loss.backward()
        summed = sum(r["proto_grad"] for r in results)
        torch.testing.assert_close(summed / WORLD_SIZE, pool.prototype_conv.weight.grad, rtol=1e-9, atol=1e-12)

    def test_not_distributed_calls_loss_unchanged(self):
        pool, embedder = make_models()
        feats, labels = global_batch()
        emb = embedder(pool(feats))
        wrapped = DistributedLossWrapper(XMLWrapper(pml_losses.ContrastiveLoss(), histogram_layer=pool))
        plain = XMLWrapper(pml_losses.ContrastiveLoss(), histogram_layer=pool)
        self.assertEqual(wrapped(emb, labels).item(), plain(emb, labels).item())

    def test_bad_input(self):
        with self.assertRaisesRegex(TypeError, "loss must be"):
            DistributedLossWrapper(torch.nn.Identity())
        with self.assertRaisesRegex(ValueError, "efficient=True"):
            DistributedLossWrapper(XMLWrapper(pml_losses.ContrastiveLoss()), efficient=True)
        # PML's own losses are still accepted (any loss module, no class-name list)
        DistributedLossWrapper(pml_losses.TripletMarginLoss())
