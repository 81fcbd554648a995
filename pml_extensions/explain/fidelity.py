"""Deletion and insertion curves of a similarity map (Petsiuk, Das and Saenko, "RISE", BMVC 2018, Sec. 4.1, for a
metric-learning pair); written from the definitions."""

from typing import Dict, Optional, Union

import torch
import torch.nn.functional as nnf
from torch import nn

from ..utils.checks import is_int, is_number
from ..utils.eval_mode import eval_mode
from .map_utils import maps_on_image

BASELINES = ("zero", "mean", "blur")


class SimilarityFidelity:
    """Deletion / insertion curves and their areas for maps of query images.

    Args:
        trunk, embedder: the query model; reference_trunk, reference_embedder: the reference model (default: query).
        steps: points of each curve after the start (default 16): step s changes ``round(s / steps · H · W)`` pixels
            (all channels of a pixel), most-attributed first (ties in raster order).
        baseline: a removed pixel's value: ``"zero"`` (default; 0 in the model's input space), ``"mean"`` (per-channel
            image mean), ``"blur"`` (Gaussian, σ = 5 % of the shorter side) or a float.
        batch_size: perturbed images per forward pass (default 64).

    ``curves(query_images [N, C, H, W], reference_images [N or 1, C', H', W'], maps [N, h, w])`` (maps not larger
    than the image, resized bilinearly) returns ``"fractions"`` ``[steps + 1]`` (pixels changed / H·W),
    ``"deletion"`` / ``"insertion"`` ``[N, steps + 1]`` (cosines, float64, CPU) and ``"deletion_area"`` /
    ``"insertion_area"`` ``[N]`` (trapezoidal, in [-1, 1]: lower deletion and higher insertion are better).

    Raises:
        ValueError: bad ``steps``/``baseline``/``batch_size``; maps whose count or size does not fit; NaN maps.

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> fid = explain.SimilarityFidelity(trunk, nn.Linear(4, 5), steps=4)
        >>> q, r = torch.rand(2, 3, 10, 12), torch.rand(2, 3, 10, 12)
        >>> out = fid.curves(q, r, explain.ActivationDecomposition(trunk, nn.Linear(4, 5))(q, r)["query"])
        >>> tuple(out["deletion"].shape), tuple(out["insertion_area"].shape)
        ((2, 5), (2,))
    """

    def __init__(
        self,
        trunk: nn.Module,
        embedder: Optional[nn.Module] = None,
        *,
        reference_trunk: Optional[nn.Module] = None,
        reference_embedder: Optional[nn.Module] = None,
        steps: int = 16,
        baseline: Union[str, float] = "zero",
        batch_size: int = 64,
    ):
        for name, v in (("steps", steps), ("batch_size", batch_size)):
            if not is_int(v) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not (is_number(baseline)) and baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES} or a number, got {baseline!r}")
        self.trunk, self.embedder = trunk, embedder if embedder is not None else nn.Identity()
        self.reference_trunk = reference_trunk if reference_trunk is not None else trunk
        if reference_embedder is None:
            reference_embedder = self.embedder if reference_trunk is None else nn.Identity()
        self.reference_embedder = reference_embedder
        self.steps, self.baseline, self.batch_size = steps, baseline, batch_size

    def _embed(self, trunk, embedder, x: torch.Tensor) -> torch.Tensor:
        outs = []
        with eval_mode(trunk, embedder), torch.no_grad():
            for start in range(0, x.shape[0], self.batch_size):
                outs.append(embedder(trunk(x[start : start + self.batch_size])).double())
        return torch.cat(outs)

    def _baseline(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.baseline, str):
            return torch.full_like(images, float(self.baseline))
        if self.baseline == "zero":
            return torch.zeros_like(images)
        if self.baseline == "mean":
            return images.mean(dim=(2, 3), keepdim=True).expand_as(images).clone()
        from torchvision.transforms.functional import gaussian_blur

        sigma = 0.05 * min(images.shape[-2:])
        k = 2 * int(3 * sigma) + 1
        return gaussian_blur(images, [k, k], [sigma, sigma])

    def curves(self, query_images: torch.Tensor, reference_images: torch.Tensor, maps) -> Dict[str, torch.Tensor]:
        """See the class docstring."""
        for arg, x in (("query_images", query_images), ("reference_images", reference_images)):
            if not torch.is_tensor(x) or x.ndim != 4 or not x.is_floating_point():
                raise ValueError(f"{arg} must be a float [N, C, H, W] tensor, got {getattr(x, 'shape', type(x))}")
        N, C, H, W = query_images.shape
        maps = torch.as_tensor(maps).detach()
        if maps.ndim != 3 or maps.shape[0] != N:
            raise ValueError(f"maps must be [N={N}, h, w], got {tuple(maps.shape)}")
        if not bool(torch.isfinite(maps).all()):
            raise ValueError("maps contain NaN or inf values")
        if reference_images.shape[0] not in (1, N):
            raise ValueError(f"reference_images must have 1 or {N} images, got {reference_images.shape[0]}")
        m = maps_on_image(maps.to(device=query_images.device, dtype=torch.float64), (H, W))
        order = torch.argsort(m.flatten(1), dim=1, descending=True, stable=True)  # [N, HW]
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(H * W, device=order.device).expand(N, -1))
        counts = [round(s / self.steps * H * W) for s in range(self.steps + 1)]
        er = self._embed(self.reference_trunk, self.reference_embedder, reference_images)
        er = er.expand(N, -1) if er.shape[0] == 1 else er
        base = self._baseline(query_images)
        out = {}
        for name in ("deletion", "insertion"):
            sims = []
            for n_changed in counts:
                changed = (rank < n_changed).view(N, 1, H, W)  # the n most-attributed pixels
                if name == "deletion":
                    x = torch.where(changed, base, query_images)
                else:
                    x = torch.where(changed, query_images, base)
                eq = self._embed(self.trunk, self.embedder, x)
                sims.append(nnf.cosine_similarity(eq, er, dim=1).cpu())
            out[name] = torch.stack(sims, dim=1)
        fractions = torch.tensor(counts, dtype=torch.float64) / (H * W)
        out["fractions"] = fractions
        for name in ("deletion", "insertion"):
            out[name + "_area"] = torch.trapezoid(out[name], fractions, dim=1)
        return out

    __call__ = curves

    def compare(self, explainers, query_images, reference_images, side: str = "query") -> Dict[str, Dict]:
        """:meth:`curves` for the ``side`` map of each ``{name: SimilarityExplainer}`` (e.g. the methods and a
        :class:`RandomExplainer`) on the same pairs; returns ``{name: curves}``."""
        if side != "query":
            raise ValueError("only the query side is perturbed; side must be 'query'")
        return {
            name: self.curves(query_images, reference_images, ex.attribute(query_images, reference_images)[side])
            for name, ex in explainers.items()
        }
