"""Partial-similarity (region-of-interest) retrieval against stored database embeddings, no re-extraction (Zhu et al.,
IEEE TIP 2021, Sec. VI-E: the query's per-position features F_ij over the original query embedding's norm)."""

from typing import Tuple, Union

import numpy as np
import torch
import torch.nn.functional as nnf

from ..utils.checks import is_int
from .activation_decomposition import ActivationDecomposition
from .folded_embedding import FoldedEmbedding
from .map_utils import point_weights
from .topk_maps import inner_product_search


class PartialSimilarityRetrieval:
    """Rank stored reference embeddings by their similarity to a region of one query image.

    ROI forms (query-image pixels): a point ``(y, x)`` (F bilinear on the feature grid), a half-open box ``(x0, y0,
    x1, y1)`` or a boolean mask ``[H, W]``. A region takes the mean of the F_ij of the cells it covers, weighted by
    the covered fraction of each cell (a point's scale; the ranking does not depend on it). The paper uses the ROI's
    centre pixel: pass ``(y, x)``.

    Raises:
        TypeError: ``decomposition`` is not an :class:`ActivationDecomposition`.
    """

    def __init__(self, decomposition: ActivationDecomposition):
        if not isinstance(decomposition, ActivationDecomposition):
            raise TypeError(f"decomposition must be an ActivationDecomposition, got {type(decomposition).__name__}")
        self.decomposition = decomposition

    def roi_weights(self, roi, image_size, feature_size, dtype=torch.float32, device=None) -> torch.Tensor:
        """``[h * w]`` weights (summing to 1) of the feature cells for ``roi``.

        Raises:
            ValueError: a point outside the image, an empty / mis-sized mask, a malformed box.
        """
        H, W = image_size
        h, w = feature_size
        arr = np.asarray(roi.cpu() if torch.is_tensor(roi) else roi)
        if arr.ndim == 2 and arr.dtype == bool:
            mask = torch.as_tensor(arr)
        elif arr.shape == (2,):
            return point_weights([arr.tolist()], (H, W), (h, w), "image", dtype=dtype, device=device)[0]
        elif arr.shape == (4,):
            x0, y0, x1, y1 = (int(v) for v in arr)
            if not (0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H):
                raise ValueError(
                    f"roi box {tuple(arr.tolist())} must satisfy 0 <= x0 < x1 <= {W} and 0 <= y0 < y1 <= {H}"
                )
            mask = torch.zeros(H, W, dtype=torch.bool)
            mask[y0:y1, x0:x1] = True
        else:
            raise ValueError(f"roi must be (y, x), (x0, y0, x1, y1) or a bool mask [H, W], got shape {arr.shape}")
        if tuple(mask.shape) != (H, W):
            raise ValueError(f"roi mask has shape {tuple(mask.shape)}, the query image is {(H, W)}")
        if not bool(mask.any()):
            raise ValueError("roi mask is empty")
        cover = nnf.interpolate(mask.to(torch.float64)[None, None], size=(h, w), mode="area")[0, 0]
        if float(cover.sum()) == 0:  # a region smaller than a cell between sample points: fall back to its centre
            ys, xs = torch.nonzero(mask, as_tuple=True)
            centre = (float(ys.float().mean()), float(xs.float().mean()))
            return point_weights([centre], (H, W), (h, w), "image", dtype=dtype, device=device)[0]
        return (cover / cover.sum()).reshape(-1).to(dtype=dtype, device=device)

    def roi_embedding(
        self, query_image: Union[torch.Tensor, FoldedEmbedding], roi
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(F_roi [L], ‖E^q‖ scalar)`` for one query image ``[1, 3, H, W]`` (or a one-image fold)."""
        fq = self.decomposition.fold_query(query_image)
        if len(fq) != 1:
            raise ValueError(f"query_image must hold one image, got {len(fq)}")
        _, h, w, L = fq.features.shape
        wts = self.roi_weights(roi, fq.image_size, (h, w), fq.features.dtype, fq.features.device)
        return wts @ fq.features[0].reshape(h * w, L), fq.embedding[0].norm()

    def scores(self, query_image, roi, ref_emb: torch.Tensor) -> torch.Tensor:
        """``[M]`` partial similarities F_roi · E^r / (‖E^q‖ ‖E^r‖) against stored ``ref_emb [M, L]`` (normalised or
        not).

        Raises:
            ValueError: ``ref_emb`` not ``[M, L]`` with the query's L.
        """
        f, norm, ref = self._roi_and_ref(query_image, roi, ref_emb)
        return (ref.to(f) @ f) / (norm * ref.to(f).norm(dim=1)).clamp_min(1e-12)

    def search(self, query_image, roi, ref_emb: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` references for the ROI: ``(scores [k], indices [k])``, best first (faiss inner product).

        Raises:
            ValueError: ``k`` not in 1..M, bad ``ref_emb``.
        """
        f, norm, ref = self._roi_and_ref(query_image, roi, ref_emb)
        if not is_int(k) or not 1 <= k <= ref.shape[0]:
            raise ValueError(f"k must be an int in [1, {ref.shape[0]}] (the reference set size), got {k!r}")
        dist, idx = inner_product_search((f.detach() / norm)[None], ref, k)
        return torch.from_numpy(dist[0]).to(f.device), torch.from_numpy(idx[0]).long().to(f.device)

    def _roi_and_ref(self, query_image, roi, ref_emb):
        f, norm = self.roi_embedding(query_image, roi)
        if not torch.is_tensor(ref_emb) or ref_emb.ndim != 2 or ref_emb.shape[1] != f.shape[0] or ref_emb.shape[0] == 0:
            raise ValueError(
                f"ref_emb must be a non-empty [M, {f.shape[0]}] tensor, got {getattr(ref_emb, 'shape', type(ref_emb))}"
            )
        return f, norm, ref_emb
