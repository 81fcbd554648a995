"""Grad-CAM baselines for a pair of images under a metric-learning model (Selvaraju et al., ICCV 2017; Zhu et al., IEEE
TIP 2021, Sec. V and VI-A; pytorch-grad-cam's similarity target, batched); sources: docs/methods/explanation.md."""

from typing import Dict, Optional

import torch
from torch import nn

from ._model_runner import ModelRunner, refuse_normalised_output, require_autograd, split_normaliser
from .base import SimilarityExplainer, query_and_reference
from .map_utils import normalize_maps, output_maps

VARIANTS = ("cosine", "dot", "rectified")


class SimilarityGradCAM(SimilarityExplainer):
    """Grad-CAM maps of the similarity of query/reference pairs, on both images.

    Variants: ``"cosine"``: Grad-CAM of S = cos(E^q, E^r) (the paper's "Grad-CAM"); ``"dot"``: of E^q · E^r, the
    pre-normalisation embeddings ("Grad-CAM (no norm)"; = "Decomposition+Bias" with ``scale="dot"`` for GAP + linear
    heads, Sec. V); ``"rectified"``: Σ_k ∂(E^q·E^r)/∂A_ijk · A_ijk (the demo's RGrad-CAM; = "Decomposition+Bias" for
    linear heads, GMP included).

    Args:
        trunk, embedder, layer: query model (``layer=None``: the last 4-D, non-pooling module call).
        reference_trunk, reference_embedder, reference_layer: optional second model for the references.

    ``maps(query_images [N or 1, 3, H, W], reference_images [N, 3, H', W'], variant=..., relu=True)`` (also
    ``attribute``) returns detached tensors on the input's device: ``"query"`` ``[N, h, w]``, ``"reference"`` ``[N,
    h', w']``, ``"similarity"`` ``[N]`` (the differentiated score); ``relu=False`` keeps the sign. Models run in eval
    mode, flags and hooks restored. Token layers and channels-last maps as in :class:`HeadFolder` (``layer=None`` on
    a class-token ViT: the last block's ``ln_1``, named in a warning). Gradients are on also inside
    ``torch.no_grad()``; inference-mode images are cloned.

    Raises:
        ValueError: unknown variant; batch sizes that do not pair; ``"dot"``/``"rectified"`` on a model that
            normalises inside ``forward``.
        RuntimeError: called under ``torch.inference_mode()``.

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> cam = explain.SimilarityGradCAM(trunk, nn.Linear(4, 5))
        >>> maps = cam.attribute(torch.rand(2, 3, 10, 12), torch.rand(2, 3, 10, 12), variant="cosine")
        >>> tuple(maps["query"].shape), tuple(maps["reference"].shape), tuple(maps["similarity"].shape)
        ((2, 8, 10), (2, 8, 10), (2,))
    """

    def __init__(
        self,
        trunk: nn.Module,
        embedder: Optional[nn.Module] = None,
        layer=None,
        *,
        reference_trunk: Optional[nn.Module] = None,
        reference_embedder: Optional[nn.Module] = None,
        reference_layer=None,
    ):
        self.query_runner, self.reference_runner = query_and_reference(
            ModelRunner, (trunk, embedder, layer), (reference_trunk, reference_embedder, reference_layer)
        )

    @staticmethod
    def _pre_norm(res, variant: str, side: str) -> torch.Tensor:
        normaliser = split_normaliser(res.head)[1]
        if normaliser is not None:
            return normaliser.input
        if variant != "cosine":
            refuse_normalised_output(
                res.output, f"the {side} model's output is L2-normalised inside forward(); variant {variant!r} needs"
            )
        return res.output

    def maps(
        self,
        query_images: torch.Tensor,
        reference_images: torch.Tensor,
        *,
        variant: str = "cosine",
        relu: bool = True,
        normalize: Optional[str] = None,
        output_size=None,
    ) -> Dict[str, torch.Tensor]:
        """Compute the maps; see the class docstring. ``normalize``/``output_size`` as in
        :meth:`ActivationDecomposition.overall_maps`."""
        require_autograd("SimilarityGradCAM")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        ModelRunner.check_images(query_images, "query_images")
        ModelRunner.check_images(reference_images, "reference_images")
        # tensors made under inference_mode cannot enter a graph: ordinary copies (same values)
        query_images, reference_images = (
            x.clone() if x.is_inference() else x for x in (query_images, reference_images)
        )
        nq, nr = query_images.shape[0], reference_images.shape[0]
        repeat = nr if (nq == 1 and nr > 1) else 1  # one body pass for the query, its head once per pair
        if nq != nr and repeat == 1:
            raise ValueError(
                f"query batch ({nq}) and reference batch ({nr}) must have the same size, or the query "
                "batch size must be 1"
            )
        with torch.enable_grad():
            rq = self.query_runner.run(query_images, mode="leaf", repeat=repeat)
            rr = self.reference_runner.run(reference_images, mode="leaf")
            # the score and the map sums in float32 (float64 stays) for half-precision models
            up = torch.float64 if rq.output.dtype == torch.float64 else torch.float32
            eq = self._pre_norm(rq, variant, "query").to(up)
            er = self._pre_norm(rr, variant, "reference").to(up)
            if variant == "cosine":
                score = torch.nn.functional.cosine_similarity(eq, er, dim=1)
            else:
                score = (eq * er).sum(dim=1)
            # pairs are independent in eval mode, so the gradient of the sum is each pair's gradient
            gq, gr = torch.autograd.grad(score.sum(), [rq.feature_map, rr.feature_map])
        out = {}
        for key, A, g, res in (("query", rq.feature_map, gq, rq), ("reference", rr.feature_map, gr, rr)):
            A, g = A.detach().to(up), g.to(up)
            if variant == "rectified":
                cam = (g * A).sum(dim=1)
            else:
                cam = (g.mean(dim=(2, 3), keepdim=True) * A).sum(dim=1)
            if relu:
                cam = torch.relu(cam)
            out[key] = output_maps(normalize_maps(cam, normalize), output_size, res.image_size)
        out["similarity"] = score.detach()
        return out

    def attribute(self, query_images, reference_images, **options) -> Dict[str, torch.Tensor]:
        """:meth:`maps` (the shared verb)."""
        return self.maps(query_images, reference_images, **options)
