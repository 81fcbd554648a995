"""Two gloo processes on CPU: the distributed XML loss equals the single-process loss on the gathered batch."""

import functools
import os
import tempfile
import unittest

import pytest
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


def _batch_worker(rank):
    pool, embedder = make_models()
    feats, labels = global_batch()
    local = slice(rank * 8, (rank + 1) * 8)
    loss_fn = DistributedLossWrapper(XMLWrapper(pml_losses.ContrastiveLoss(), xml_weight=0.5, histogram_layer=pool))
    emb = embedder(pool(feats[local]))
    loss = loss_fn(emb, labels[local])
    loss.backward()
    return {"loss": loss.detach(), "xml": loss_fn.loss.xml_loss, "proto_grad": pool.prototype_conv.weight.grad}


def _worker(rank, init_file, out_dir):
    """Every scenario of this file, one after the other, in one group of two processes (each spawned process
    imports torch again: one pair serves the three tests); each scenario's results in ``{name}_rank{rank}.pt``."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    try:
        for name, scenario in SCENARIOS.items():
            torch.save(scenario(rank), os.path.join(out_dir, f"{name}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@functools.lru_cache(maxsize=None)
def spawned_results():
    """``{scenario: [rank 0's results, rank 1's]}`` of one :func:`_worker` run (spawned once per test process)."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=WORLD_SIZE, join=True)
        return {
            name: [torch.load(os.path.join(tmp, f"{name}_rank{r}.pt"), weights_only=True) for r in range(WORLD_SIZE)]
            for name in SCENARIOS
        }


class TestDistributedLossWrapper(unittest.TestCase):
    def test_two_processes_equal_single_process_on_gathered_batch(self):
        results = spawned_results()["batch"]
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


# ---------------------------------------------------------------------------------------- stateful losses (CBM)
MEMORY = 24
STEPS = 3


def make_memory_loss(pool):
    inner = pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), embedding_size=3, memory_size=MEMORY)
    return XMLWrapper(inner, xml_weight=0.5, histogram_layer=pool)


def memory_batches():
    """STEPS global batches of 16 feature maps (8 classes × 2), rank r taking rows [8r, 8r + 8)."""
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(STEPS):
        feats = torch.randn(16, 6, 3, 3, dtype=torch.float64, generator=g)
        out.append((feats, torch.arange(8).repeat_interleave(2)[torch.randperm(16, generator=g)]))
    return out


def _memory_worker(rank):
    pool, embedder = make_models()
    loss_fn = DistributedLossWrapper(make_memory_loss(pool))
    losses = []
    for feats, labels in memory_batches():
        local = slice(rank * 8, (rank + 1) * 8)
        losses.append(loss_fn(embedder(pool(feats[local])), labels[local]).detach() / WORLD_SIZE)
    cbm = loss_fn.loss.loss
    return {"losses": torch.stack(losses), "memory": cbm.embedding_memory, "labels": cbm.label_memory}


@pytest.mark.slow
def test_stateful_loss_every_rank_equals_the_single_process_and_memories_agree():
    """XMLWrapper(CrossBatchMemory): PML's own-rows-first gather gave each rank a different batch order (PML
    issue #639), so rank 1's loss and memory differed from rank 0's; in rank order both are the single process's."""
    results = spawned_results()["memory"]
    pool, embedder = make_models()
    single = make_memory_loss(pool)
    expected = torch.stack([single(embedder(pool(f)), y).detach() for f, y in memory_batches()])
    for r in results:
        torch.testing.assert_close(r["losses"], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(r["memory"], single.loss.embedding_memory, rtol=0, atol=0)
        assert torch.equal(r["labels"], single.loss.label_memory)
    assert torch.equal(results[0]["memory"], results[1]["memory"])


def _indices_worker(rank):
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(10, 3, dtype=torch.float64, generator=g)
    labels = torch.tensor([0, 1, 0, 1, 2, 2, 3, 3, 4, 4])
    sizes = (4, 6)  # unequal local batches
    start = sum(sizes[:rank])
    local = slice(start, start + sizes[rank])
    # a local triplet (anchor, positive, negative) of this rank's rows, in PML's convention (local indices)
    triplet = (torch.tensor([0]), torch.tensor([2 if rank == 0 else 1]), torch.tensor([1 if rank == 0 else 2]))
    loss_fn = DistributedLossWrapper(pml_losses.TripletMarginLoss(margin=10.0))
    loss = loss_fn(emb[local], labels[local], triplet) / WORLD_SIZE
    return {"loss": loss.detach()}


#: what :func:`_worker` runs, by name
SCENARIOS = {"batch": _batch_worker, "memory": _memory_worker, "indices": _indices_worker}


@pytest.mark.slow
def test_unequal_batches_and_local_indices_tuple_name_the_local_rows():
    results = spawned_results()["indices"]
    g = torch.Generator().manual_seed(3)
    emb = torch.nn.functional.normalize(torch.randn(10, 3, dtype=torch.float64, generator=g))  # LpDistance's default
    for rank, (a, p, n) in enumerate([(0, 2, 1), (4 + 0, 4 + 1, 4 + 2)]):
        expected = (emb[a] - emb[p]).norm() - (emb[a] - emb[n]).norm() + 10.0  # one triplet, margin 10: > 0
        torch.testing.assert_close(results[rank]["loss"], expected, rtol=1e-12, atol=1e-12)


def test_efficient_mode_refuses_a_memory_bank():
    cbm = pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), embedding_size=3)
    with pytest.raises(ValueError, match="memory bank"):
        DistributedLossWrapper(cbm, efficient=True)
