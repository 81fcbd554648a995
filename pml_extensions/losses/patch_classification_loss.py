"""Auxiliary per-patch classification loss of the template-matching block (Gorgun, Gurbuz & Alatan, BMVC 2022,
arXiv 2210.00992, Sec. 3.3, Eq. 3.1's second term): the cross-entropy of the block's per-pixel class scores
against the image label, averaged over pixels (and images)."""

from typing import Sequence, Union

import torch
import torch.nn.functional as F


class PatchClassificationLoss(torch.nn.Module):
    """mean over images and pixels of CE(softmax(a[:, :, i, j]), y).

    Like ``torch.nn.CrossEntropyLoss`` it takes scores and labels, not embeddings.

    ``forward(class_scores [B, c, H, W] (or a list of such maps, averaged), labels [B] int64 in [0, c)) ->
    scalar`` (dtype of the scores). Averaging over patches (the paper does not say) keeps the scale independent of
    H × W.

    Raises:
        ValueError: if the scores are not 4-D, the batch sizes differ, c < 2, or a label is outside [0, c).
        TypeError: if the labels are not an integer tensor.
    """

    def forward(self, class_scores: Union[torch.Tensor, Sequence[torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        if isinstance(class_scores, (list, tuple)):
            if not class_scores:
                raise ValueError("class_scores is an empty list")
            return torch.stack([self.forward(s, labels) for s in class_scores]).mean()
        if not torch.is_tensor(class_scores) or class_scores.ndim != 4:
            raise ValueError(
                f"class_scores must be a [B, c, H, W] tensor, got {getattr(class_scores, 'shape', type(class_scores))}"
            )
        if not torch.is_tensor(labels) or labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise TypeError(f"labels must be an integer tensor, got {getattr(labels, 'dtype', type(labels))}")
        b, c, h, w = class_scores.shape
        if labels.shape != (b,):
            raise ValueError(f"labels must have shape [{b}] to match the scores, got {tuple(labels.shape)}")
        if c < 2:
            raise ValueError(f"class_scores need >= 2 classes, got {c}")
        labels = labels.to(class_scores.device)
        if b and (int(labels.min()) < 0 or int(labels.max()) >= c):
            raise ValueError(
                f"labels must lie in [0, {c}) (the block's training classes), got range "
                f"[{int(labels.min())}, {int(labels.max())}]"
            )
        target = labels.long()[:, None, None].expand(b, h, w)
        return F.cross_entropy(class_scores, target)
