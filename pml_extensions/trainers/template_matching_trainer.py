"""PML trainer that adds the template-matching block's auxiliary patch-classification loss (Gorgun, Gurbuz & Alatan,
BMVC 2022, arXiv 2210.00992, Sec. 3.3, Eq. 3.1; λ = 0.5: the paper's "equal weighting").
"""

from typing import List

import torch
from pytorch_metric_learning.trainers import TrainWithClassifier

from ..losses.patch_classification_loss import PatchClassificationLoss
from ..trunks.template_matching_block import TemplateMatchingBlock
from ._pinned_memory import _PinnedMemoryMixin

AUX_LOSS = "template_aux_loss"


class TemplateMatchingTrainer(_PinnedMemoryMixin, TrainWithClassifier):
    """``TrainWithClassifier`` plus the auxiliary per-patch loss of every :class:`TemplateMatchingBlock` in the models:
    ``L = (1 − λ) · main + λ · mean_patches CE(h2(h1(I)), y)``, "main" being what ``TrainWithClassifier`` computes (the
    classifier loss, as the paper, and/or the metric loss: the block's class scores then act as templates).

    Args:
        *args, **kwargs: as PML's ``TrainWithClassifier``; ``loss_funcs[AUX_LOSS]`` (``"template_aux_loss"``) defaults
            to :class:`PatchClassificationLoss` (any ``(class_scores [B, c, H, W], labels [B]) -> scalar``).
        aux_weight: λ in [0, 1] (paper: 0.5): effective weights (1 − λ)·w for every main loss and λ·w for the aux loss
            (w from ``loss_weights``, default 1).
        freeze_block_batchnorm: with PML's ``freeze_trunk_batchnorm=True``, also freeze the blocks' (new) BN-ReLU
            mixing BN.

    ``self.losses`` (logged under ``loss_histories``) holds ``metric_loss``, ``classifier_loss``, ``template_aux_loss``
    (mean over blocks) and ``total_loss``, each times its effective weight. Labels must be the block's class indices in
    [0, c). The block keeps its scores as an attribute: use ``DistributedDataParallel``, not ``DataParallel``.

    Raises:
        ValueError: ``aux_weight`` outside [0, 1], ``loss_weights`` naming a loss not in ``loss_funcs``, no
            :class:`TemplateMatchingBlock` in the models (see
            :func:`pml_extensions.trunks.template_matching_inserter.insert_template_matching`), or a forward pass in
            which no block produced scores.
    """

    def __init__(self, *args, aux_weight: float = 0.5, freeze_block_batchnorm: bool = False, **kwargs):
        aux_weight = float(aux_weight)
        if not 0.0 <= aux_weight <= 1.0:
            raise ValueError(f"aux_weight (λ) must be in [0, 1], got {aux_weight!r}")
        self.aux_weight = aux_weight
        self.freeze_block_batchnorm = bool(freeze_block_batchnorm)
        super().__init__(*args, **kwargs)

    def maybe_freeze_trunk_batchnorm(self):
        """PML's ``freeze_trunk_batchnorm``, then the blocks' mixing BN back in training mode (unless frozen too)."""
        super().maybe_freeze_trunk_batchnorm()
        if self.freeze_trunk_batchnorm and not self.freeze_block_batchnorm:
            for block in getattr(self, "template_blocks", []):
                if block.mixer is not None and block.training:
                    block.mixer.train()

    def custom_setup(self):
        self.loss_funcs = dict(self.loss_funcs)
        self.loss_funcs.setdefault(AUX_LOSS, PatchClassificationLoss())
        self.loss_names = list(self.loss_funcs.keys())
        given = dict(self.loss_weights) if self.loss_weights is not None else {}
        unknown = sorted(set(given) - set(self.loss_names))
        if unknown:
            raise ValueError(f"loss_weights has keys {unknown} that are not in loss_funcs {self.loss_names}")
        self.user_loss_weights = {k: given.get(k, 1) for k in self.loss_names}
        self.loss_weights = {
            k: (self.aux_weight if k == AUX_LOSS else 1 - self.aux_weight) * w
            for k, w in self.user_loss_weights.items()
        }

    def modify_schema(self):
        super().modify_schema()
        self.schema["loss_funcs"].keys += [AUX_LOSS]

    def initialize_models(self):
        super().initialize_models()
        blocks = {
            id(m): m for model in self.models.values() for m in model.modules() if isinstance(m, TemplateMatchingBlock)
        }
        self.template_blocks: List[TemplateMatchingBlock] = list(blocks.values())
        if not self.template_blocks:
            raise ValueError(
                "no TemplateMatchingBlock found in the models; build the trunk with "
                "pml_extensions.trunks.template_matching_inserter.insert_template_matching"
            )

    def calculate_loss(self, curr_batch):
        for block in self.template_blocks:
            block.last_class_scores = None
        super().calculate_loss(curr_batch)
        _, labels = curr_batch
        self.losses[AUX_LOSS] = self.maybe_get_template_aux_loss(labels)

    def maybe_get_template_aux_loss(self, labels) -> torch.Tensor:
        """The λ-unweighted aux loss, averaged over blocks; 0 when its effective weight is 0."""
        if self.loss_weights.get(AUX_LOSS, 0) <= 0:
            return 0
        scores = [b.last_class_scores for b in self.template_blocks if b.last_class_scores is not None]
        if not scores:
            raise ValueError("no TemplateMatchingBlock produced class scores in this forward pass")
        losses = [self.loss_funcs[AUX_LOSS](s, labels.to(s.device)) for s in scores]
        return losses[0] if len(losses) == 1 else torch.stack(losses).mean()
