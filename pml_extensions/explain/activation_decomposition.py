"""Activation decomposition of a metric-learning similarity into image regions (Zhu et al., "Visual Explanation for
Deep Metric Learning", IEEE TIP 2021, arXiv 1909.12977, Sec. III, eq. 5); deviations from the authors' demo:
docs/methods/explanation.md."""

import functools
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .base import SimilarityExplainer, query_and_reference
from .folded_embedding import FoldedEmbedding
from .head_folder import HeadFolder
from .map_utils import normalize_maps, output_maps, point_weights

SCALES = ("cosine", "dot")
Images = Union[torch.Tensor, FoldedEmbedding]


class ActivationDecomposition(SimilarityExplainer):
    """Explain S = E^q · E^r / (‖E^q‖ ‖E^r‖) through the last convolutional feature maps of both images.

    With the folded head E = Σ_ij W_ij A_ij + B (:class:`HeadFolder`) and F_ij = W_ij A_ij: point-to-point map
    D(i, j, x, y) = F^q_ij · F^r_xy (eq. 5); "Decomposition" Q(i, j) = F^q_ij · Σ_xy F^r_xy, "Decomposition+Bias"
    F^q_ij · E^r (the reference maps swap q and r; B^q · B^r is dropped); point-specific map of query pixel (y, x):
    F^q_(y,x) · F^r_(x', y') (F^q bilinear on the grid). All terms sum to E^q·E^r exactly, so with ``scale="cosine"``
    (default, over Z = ‖E^q‖‖E^r‖, eq. 5) they sum to the cosine.

    Args:
        trunk, embedder, layer: the query model (:class:`HeadFolder`; ``layer=None`` finds the last 4-D map).
        reference_trunk, reference_embedder, reference_layer: optional reference / database model (e.g. a teacher or
            an aerial branch) of the same embedding width L. Default: the query model.
        fallback, gmp_ties: passed to :class:`HeadFolder`.

    Inputs: image batches ``[N, 3, H, W]`` or :class:`FoldedEmbedding` objects; a query batch of 1 pairs with every
    reference, otherwise pairs are one-to-one. Outputs: signed tensors on the input's device, in its dtype (float32
    for bfloat16/float16 or autocast). Models run in eval mode; flags and hooks are restored, also after an
    exception. ``attribute`` is :meth:`overall_maps`.

    Raises:
        ValueError: batch sizes that do not pair, embeddings of different widths, unknown options, points outside the
            image, an unsupported head (see :class:`HeadFolder`).
        TypeError: inputs that are neither tensors nor :class:`FoldedEmbedding`.

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> dec = explain.ActivationDecomposition(trunk, nn.Linear(4, 5))
        >>> maps = dec.attribute(torch.rand(1, 3, 10, 12), torch.rand(3, 3, 10, 12))  # a query and its top-3
        >>> tuple(maps["query"].shape), tuple(maps["reference"].shape), tuple(maps["similarity"].shape)
        ((3, 8, 10), (3, 8, 10), (3,))
    """

    def attribute(self, query_images: Images, reference_images: Images, **options) -> Dict[str, torch.Tensor]:
        """:meth:`overall_maps` (the shared verb)."""
        return self.overall_maps(query_images, reference_images, **options)

    def __init__(
        self,
        trunk: nn.Module,
        embedder: Optional[nn.Module] = None,
        layer=None,
        *,
        reference_trunk: Optional[nn.Module] = None,
        reference_embedder: Optional[nn.Module] = None,
        reference_layer=None,
        fallback: str = "error",
        gmp_ties: str = "share",
    ):
        self.query_folder, self.reference_folder = query_and_reference(
            functools.partial(HeadFolder, fallback=fallback, gmp_ties=gmp_ties),
            (trunk, embedder, layer),
            (reference_trunk, reference_embedder, reference_layer),
        )

    def fold_query(self, images: Images) -> FoldedEmbedding:
        """Fold the query model at ``images [N, 3, H, W]`` (a :class:`FoldedEmbedding` passes through)."""
        return self._fold(self.query_folder, images, "query_images")

    def fold_reference(self, images: Images) -> FoldedEmbedding:
        """Fold the reference model at ``images [M, 3, H, W]`` (a :class:`FoldedEmbedding` passes through)."""
        return self._fold(self.reference_folder, images, "reference_images")

    @staticmethod
    def _fold(folder: HeadFolder, images: Images, arg: str) -> FoldedEmbedding:
        if isinstance(images, FoldedEmbedding):
            return images
        if not torch.is_tensor(images):
            raise TypeError(f"{arg} must be a tensor [N, 3, H, W] or a FoldedEmbedding, got {type(images).__name__}")
        folder.runner.check_images(images, arg)  # names the argument (shape, NaN / inf images, dtype)
        return folder(images)

    def _pair(self, query: Images, reference: Images, scale: str) -> Tuple[FoldedEmbedding, FoldedEmbedding]:
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        fq, fr = self.fold_query(query), self.fold_reference(reference)
        if fq.features.shape[-1] != fr.features.shape[-1]:
            raise ValueError(
                f"query and reference embeddings differ in width: {fq.features.shape[-1]} vs {fr.features.shape[-1]}"
            )
        if len(fq) == 1 and len(fr) > 1:
            fq = fq.apply(lambda t: t.expand(len(fr), *t.shape[1:]))
        elif len(fq) != len(fr):
            raise ValueError(
                f"query batch ({len(fq)}) and reference batch ({len(fr)}) must have the same size, or the query "
                "batch size must be 1"
            )
        return fq, fr

    @staticmethod
    def _z(fq: FoldedEmbedding, fr: FoldedEmbedding, check: bool = True) -> torch.Tensor:
        """Z = ‖E^q‖‖E^r‖ per pair; with ``check`` a zero embedding (cosine undefined) raises ValueError."""
        nq, nr = fq.embedding.norm(dim=1), fr.embedding.norm(dim=1)
        if check:
            for side, norms in (("query", nq), ("reference", nr)):
                zero = (norms == 0).nonzero().flatten().tolist()
                if zero:
                    raise ValueError(
                        f"the {side} embedding of pair(s) {zero} is exactly zero: its cosine similarity and "
                        "scale='cosine' maps are undefined; use scale='dot'"
                    )
        return nq * nr

    def point_to_point(self, query_images: Images, reference_images: Images, *, scale: str = "dot") -> torch.Tensor:
        """D(i, j, x, y) = F^q_ij · F^r_xy for every pair (inputs as in the class docstring), one batched einsum.

        Args:
            scale: ``"dot"`` (default, un-normalised) or ``"cosine"`` (divided by Z per pair).

        Returns:
            ``[N, h, w, h', w']`` signed tensor.
        """
        fq, fr = self._pair(query_images, reference_images, scale)
        D = torch.einsum("nijl,nxyl->nijxy", fq.features, fr.features)
        if scale == "cosine":
            D = D / self._z(fq, fr).view(-1, 1, 1, 1, 1)
        return D

    def overall_maps(
        self,
        query_images: Images,
        reference_images: Images,
        *,
        bias: bool = False,
        scale: str = "cosine",
        relu_then_sum: bool = False,
        normalize: Optional[str] = None,
        output_size=None,
    ) -> Dict[str, torch.Tensor]:
        """Overall maps on the query and on the retrieved image (paper Sec. III, "Decomposition" / "+Bias").

        Args:
            bias: ``False`` → "Decomposition" F^q_ij · Σ_xy F^r_xy; ``True`` → "Decomposition+Bias" F^q_ij · E^r (and
                the swap for the reference map).
            scale: ``"cosine"`` (default; divided by Z = ‖E^q‖‖E^r‖, eq. 5) or ``"dot"``.
            relu_then_sum: the demo's Σ_xy ReLU(D(i, j, x, y)) (not eq. 5; incompatible with ``bias``).
            normalize: ``None`` (default; signed), ``"minmax"`` or ``"max_abs"`` (:func:`normalize_maps`).
            output_size: ``None`` (feature resolution), ``"image"`` (bilinear, to each image) or ``(H, W)``.

        Returns:
            ``"query"`` ``[N, h, w]``, ``"reference"`` ``[N, h', w']``, ``"similarity"`` ``[N]`` (cosine of the
            pre-normalisation embeddings; 0 for a zero embedding with ``scale="dot"``) and ``"dot"`` ``[N]`` (E^q·E^r).

        Raises:
            ValueError: with ``scale="cosine"``, an exactly-zero embedding (named by pair and side).
        """
        if relu_then_sum and bias:
            raise ValueError("relu_then_sum reproduces the demo code, which has no bias term: use bias=False")
        fq, fr = self._pair(query_images, reference_images, scale)
        if relu_then_sum:
            D = torch.relu(torch.einsum("nijl,nxyl->nijxy", fq.features, fr.features))
            q, r = D.sum(dim=(3, 4)), D.sum(dim=(1, 2))
        else:
            target_q = fr.features.sum(dim=(1, 2)) + (fr.bias if bias else 0)
            target_r = fq.features.sum(dim=(1, 2)) + (fq.bias if bias else 0)
            q = torch.einsum("nijl,nl->nij", fq.features, target_q)
            r = torch.einsum("nxyl,nl->nxy", fr.features, target_r)
        z = self._z(fq, fr, check=scale == "cosine")
        dot = (fq.embedding * fr.embedding).sum(dim=1)
        similarity = dot / torch.where(z > 0, z, torch.ones_like(z))  # 0 for a zero embedding (torch's rule)
        if scale == "cosine":
            q, r = q / z.view(-1, 1, 1), r / z.view(-1, 1, 1)
        q = output_maps(normalize_maps(q, normalize), output_size, fq.image_size)
        r = output_maps(normalize_maps(r, normalize), output_size, fr.image_size)
        return {"query": q, "reference": r, "similarity": similarity, "dot": dot}

    def point_specific(
        self,
        query_images: Images,
        reference_images: Images,
        points: Sequence[Sequence[float]],
        *,
        coordinates: str = "image",
        scale: str = "cosine",
        normalize: Optional[str] = None,
        output_size=None,
    ) -> torch.Tensor:
        """Point-specific maps I_p(x, y) = F^q_p · F^r_xy on the reference image for query points p.

        Args:
            points: ``[P, 2]`` (y, x) pairs, the same for every pair: query-image pixels (``coordinates="image"``,
                default; bilinear on the feature grid as the demo's ``Point_Specific``) or integer feature positions
                (``"feature"``: the map's sum is then the (i, j) entry of the "Decomposition" query map).
            scale, normalize, output_size: as in :meth:`overall_maps` (``"image"``: the reference image).

        Returns:
            ``[N, P, h', w']`` signed tensor.

        Raises:
            ValueError: a point outside the query image / feature map.
        """
        fq, fr = self._pair(query_images, reference_images, scale)
        n, h, w, L = fq.features.shape
        wts = point_weights(
            points, fq.image_size, (h, w), coordinates, dtype=fq.features.dtype, device=fq.features.device
        )
        Fp = torch.einsum("pk,nkl->npl", wts, fq.features.reshape(n, h * w, L))
        maps = torch.einsum("npl,nxyl->npxy", Fp, fr.features)
        if scale == "cosine":
            maps = maps / self._z(fq, fr).view(-1, 1, 1, 1)
        return output_maps(normalize_maps(maps, normalize), output_size, fr.image_size)
