"""Container for a head folded into per-position contributions (Zhu et al., "Visual Explanation for Deep Metric
Learning", IEEE TIP 2021, eq. 4: E = Σ_ij W_ij A_ij + B)."""

import dataclasses
from typing import Tuple

import torch


@dataclasses.dataclass
class FoldedEmbedding:
    """Per-position contributions of the explained feature map to the pre-normalisation embedding.

    Attributes:
        features: ``[N, h, w, L]`` float tensor, F_ij = W_ij A_ij (the "per-position features" of the paper's
            partial similarity, Sec. VI-E), on the input's device and dtype.
        bias: ``[N, L]``, B; the per-image bias (ReLU / GMP masks and Taylor terms make it input dependent).
        embedding: ``[N, L]``, the model's pre-normalisation embedding E; ``features.sum((1, 2)) + bias ==
            embedding`` exactly for folded heads and at the current input for the first-order fallback.
        feature_map: ``[N, C, h, w]``, the explained activations A (detached).
        image_size: ``(H, W)`` of the input images, pixels.
        normalised: whether the model's output is ``E / ||E||`` (an L2-normalising head).
        exact: ``False`` when the first-order ``torch.func`` fallback was used.
    """

    features: torch.Tensor
    bias: torch.Tensor
    embedding: torch.Tensor
    feature_map: torch.Tensor
    image_size: Tuple[int, int]
    normalised: bool = False
    exact: bool = True

    def __len__(self) -> int:
        return self.features.shape[0]

    @property
    def feature_size(self) -> Tuple[int, int]:
        """``(h, w)`` of the explained feature map."""
        return (self.features.shape[1], self.features.shape[2])

    def apply(self, fn) -> "FoldedEmbedding":
        """The same fold with ``fn`` applied to each of its four tensors (e.g. indexing, ``expand``)."""
        tensors = ("features", "bias", "embedding", "feature_map")
        return dataclasses.replace(self, **{name: fn(getattr(self, name)) for name in tensors})

    def __getitem__(self, index) -> "FoldedEmbedding":
        """Select images (int, slice or index tensor); keeps the batch dimension."""
        if isinstance(index, int):
            index = slice(index, index + 1) if index != -1 else slice(-1, None)
        return self.apply(lambda t: t[index])
