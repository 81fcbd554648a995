"""RAML's teacher training with PML's own classes: triplet loss + distance-weighted negatives, AdamW + one-cycle.

Source: P. Suma and G. Tolias, WACV 2023, Sec. 5 ("Teacher networks are trained with triplet loss and distance
weighted negative mining [Wu et al. 2017]"); margin 0.7 on squared L2, batches of 2 classes × 4 images, distances
clamped at 0.5 from ``pavelsuma/raml`` (``lib/cli.py``, ``lib/datasets/traindataset.py``). Deviations: PML's
``DistanceWeightedMiner`` draws one weighted negative per anchor-positive pair inside the batch (the code draws 4
negatives per anchor from a 20k-image pool re-embedded every epoch); larger batches (``classes_per_batch``) make the
pool larger.
"""

from typing import Optional

import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import TripletMarginLoss
from pytorch_metric_learning.miners import DistanceWeightedMiner
from pytorch_metric_learning.samplers import MPerClassSampler
from pytorch_metric_learning.trainers import MetricLossOnly

from ..utils.checks import is_int
from .resolution_distillation_trainer import make_optimizers


def make_teacher_trainer(
    trunk: torch.nn.Module,
    embedder: torch.nn.Module,
    dataset,
    labels=None,
    lr: float = 1e-4,
    margin: float = 0.7,
    images_per_class: int = 4,
    classes_per_batch: int = 2,
    weight_decay: float = 1e-6,
    iterations_per_epoch: Optional[int] = None,
    data_device=None,
    dataloader_num_workers: int = 0,
    **kwargs,
) -> MetricLossOnly:
    """A PML ``MetricLossOnly`` configured as RAML's teacher recipe (not yet trained: call ``.train(1, epochs)``).

    Loss ``TripletMarginLoss(margin, distance=LpDistance(power=2))`` (squared Euclidean on L2-normalised embeddings),
    miner ``DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)``, sampler ``MPerClassSampler(labels,
    m=images_per_class)`` with ``classes_per_batch × images_per_class`` images per batch, :func:`make_optimizers`.
    ``dataset`` yields ``(image tensor, class label)``; ``labels`` default to ``dataset.labels``; extra kwargs go to
    ``MetricLossOnly``. ValueError: no labels, or a size that is not positive.
    """
    if labels is None:
        labels = getattr(dataset, "labels", None)
    if labels is None:
        raise ValueError("labels are required (dataset has no .labels)")
    for name, v in (("images_per_class", images_per_class), ("classes_per_batch", classes_per_batch)):
        if not is_int(v) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    batch_size = images_per_class * classes_per_batch
    sampler = MPerClassSampler(labels, m=images_per_class, batch_size=batch_size, length_before_new_iter=len(labels))
    return MetricLossOnly(
        models={"trunk": trunk, "embedder": embedder},
        optimizers=make_optimizers(trunk, embedder, lr=lr, weight_decay=weight_decay),
        batch_size=batch_size,
        loss_funcs={"metric_loss": TripletMarginLoss(margin=margin, distance=LpDistance(power=2))},
        mining_funcs={"tuple_miner": DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)},
        dataset=dataset,
        sampler=sampler,
        iterations_per_epoch=iterations_per_epoch,
        data_device=data_device,
        dataloader_num_workers=dataloader_num_workers,
        **kwargs,
    )
