"""The shared verb of every explainer, like captum's ``attribute()`` (:class:`SimilarityExplainer`)."""

from typing import Callable, Dict, Tuple

import torch


def query_and_reference(make: Callable, query: Tuple, reference: Tuple) -> Tuple:
    """``(make(*query), make(*reference))`` for ``(trunk, embedder, layer)`` triples; without a reference trunk the
    reference side is the query's object (``ValueError`` when a reference embedder or layer is given alone)."""
    first = make(*query)
    if reference[0] is not None:
        return first, make(*reference)
    if reference[1] is not None or reference[2] is not None:
        raise ValueError("reference_embedder / reference_layer need reference_trunk")
    return first, first


class SimilarityExplainer:
    """Base class: ``attribute(query_images [N or 1, C, H, W], reference_images [N, C, H', W'], **options)`` (or
    ``explainer(q, r)``) returns ``"query"`` ``[N, h, w]``, ``"reference"`` ``[N, h', w']`` (signed float maps on the
    inputs' device) and ``"similarity"`` ``[N]``; subclasses implement :meth:`attribute`.

    Example::

        >>> import torch; from torch import nn; from pml_extensions import explain
        >>> trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> explainer = explain.ActivationDecomposition(trunk)       # any SimilarityExplainer
        >>> maps = explainer.attribute(torch.rand(2, 3, 10, 12), torch.rand(2, 3, 10, 12))
        >>> tuple(maps["query"].shape), tuple(maps["reference"].shape), tuple(maps["similarity"].shape)
        ((2, 8, 10), (2, 8, 10), (2,))
    """

    def attribute(self, query_images, reference_images, **options) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, query_images, reference_images, **options) -> Dict[str, torch.Tensor]:
        return self.attribute(query_images, reference_images, **options)


class RandomExplainer(SimilarityExplainer):
    """Control: uniform random maps in [0, 1) at image resolution (or ``map_size`` ``(h, w)``) from a private
    ``torch.Generator`` seeded with ``seed`` (default 0); ``"similarity"`` is NaN (a random map explains no score).
    Successive calls draw new maps; :meth:`reset` restarts.

    Example::

        >>> import torch; from pml_extensions import explain
        >>> rnd = explain.RandomExplainer(seed=0)
        >>> maps = rnd.attribute(torch.rand(2, 1, 16, 43), torch.rand(2, 1, 16, 43))
        >>> tuple(maps["query"].shape)
        (2, 16, 43)
    """

    def __init__(self, seed: int = 0, map_size=None):
        self.seed = int(seed)
        self.map_size = None if map_size is None else tuple(int(s) for s in map_size)
        self.reset()

    def reset(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def _draw(self, images: torch.Tensor) -> torch.Tensor:
        size = self.map_size or tuple(images.shape[-2:])
        shape = (images.shape[0],) + size
        m = torch.rand(shape, generator=self.generator, dtype=torch.float64, device=self.generator.device)
        return m.to(device=images.device, dtype=images.dtype)

    def attribute(self, query_images, reference_images, **options) -> Dict[str, torch.Tensor]:
        if options:
            raise ValueError(f"RandomExplainer.attribute takes no options, got {sorted(options)}")
        for arg, x in (("query_images", query_images), ("reference_images", reference_images)):
            if not torch.is_tensor(x) or x.ndim != 4:
                raise ValueError(f"{arg} must be a [N, C, H, W] tensor, got {getattr(x, 'shape', type(x))}")
        n = max(query_images.shape[0], reference_images.shape[0])
        q = self._draw(query_images)
        if q.shape[0] == 1 and n > 1:
            q = q.expand(n, -1, -1)
        r = self._draw(reference_images)
        sim = torch.full((n,), float("nan"), dtype=q.dtype, device=q.device)
        return {"query": q, "reference": r, "similarity": sim}
