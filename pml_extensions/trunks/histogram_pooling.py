"""Prototype-histogram pooling (XML, Gurbuz & Alatan, ICIP 2023, Sec. 2.1-2.2): global average pooling that also
keeps the soft histogram of the local features over m learnable prototypes; our deviations: docs/methods/xml.md."""

import itertools
import math
from typing import Callable, Iterable, List, Optional

import torch
import torch.nn.functional as F

from ..utils.checks import is_int, is_number
from ..utils.eval_mode import eval_mode
from ..utils.wiring import data_init, param_group
from ._last_outputs import _KeepsLastOutputs

PROTOTYPE_INITS = ("random", "kcenter", "kmeans")
#: faiss's recommended least number of training points per k-means centroid (its min_points_per_centroid)
KMEANS_POINTS_PER_PROTOTYPE = 39
#: data-driven initialisations that ``HistogramPooling(lazy_init=...)`` can run on the first training batches
LAZY_INITS = ("kmeans", "kcenter")
#: ε of the paper (raw inner products of CNN features)
PAPER_SCALE = 10.0
#: ε on cosine logits (``normalize=True``): 10 leaves the histograms nearly uniform and the XML term constant
#: (benchmarks/xml_signal.py); 100 makes them peaked from the first step
DEFAULT_SCALE_NORMALIZED = 100.0


def _check_feature_map(x, in_channels=None, name="x", owner="layer"):
    if not torch.is_tensor(x) or x.ndim != 4:
        raise ValueError(f"{name} must be a [B, C, H, W] tensor, got {getattr(x, 'shape', type(x))}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point feature map, got dtype {x.dtype}")
    if x.shape[2] < 1 or x.shape[3] < 1:
        raise ValueError(f"{name} must have at least one position (H, W >= 1), got {tuple(x.shape)}")
    if in_channels is not None and x.shape[1] != in_channels:
        raise ValueError(f"{name} has {x.shape[1]} channels but the {owner} was built with in_channels={in_channels}")


class HistogramPooling(_KeepsLastOutputs, torch.nn.Module):
    """Global average pooling that also keeps the soft prototype histogram of each image.

    Args:
        in_channels: C, the width of the feature map (e.g. 1280 for MobileNetV2).
        num_prototypes: m. Paper: 64 (CUB, Cars), 128 (SOP, InShop).
        scale: ε, inverse temperature of the soft-max over prototypes. Default: 100 with ``normalize=True`` (ε = 10
            leaves cosine histograms nearly uniform, ``benchmarks/results/xml_signal.md``), else the paper's 10.
        normalize: L2-normalise local features and prototypes before the inner product (default ``True``, our
            choice); ``False``: the paper's raw inner products.
        device, dtype: factory arguments for the prototype weights.
        seed: seed of the private generator of the random prototypes and the lazy initialisation.
        lazy_init: ``None`` (default: random prototypes), ``"kmeans"`` or ``"kcenter"``: :meth:`init_prototypes` on
            the local features of the first ``lazy_init_batches`` training forwards (at most ``20000 /
            lazy_init_batches`` seeded features each, more batches while they hold fewer than ``num_prototypes``);
            the forward that completes them already uses the prototypes. Cancelled when prototypes are given
            (``init_*``, :meth:`reset_parameters`, ``load_state_dict``); under ``torch.distributed`` rank 0's win.
        lazy_init_batches: training forwards that feed the lazy initialisation (default 4).
        keepdim: return ``[B, C, 1, 1]`` (``AdaptiveAvgPool2d(1)``'s shape) instead of ``[B, C]``.

    ``forward(x [B, C, H, W]) -> [B, C]`` is the GAP vector (dtype of ``x``; ``[B, C, 1, 1]`` with ``keepdim``). The
    soft histograms ``[B, m]`` (rows on the simplex, with their graph; float32, float64 for float64 input, also under
    autocast) are kept in ``last_histograms``, the GAP vectors in ``last_pooled``; copies of the layer (deepcopy,
    pickling, ``AveragedModel``) hold ``None`` until their own forward. ``feat_mult()`` / ``num_features`` give C,
    ``histogram_size`` gives m.

    Raises:
        ValueError: on non-positive sizes or scale, an unknown ``lazy_init``, or a feature map with the wrong rank
            or width.

    Example::

        >>> pool = HistogramPooling(8, 4, lazy_init="kmeans", lazy_init_batches=1)
        >>> _ = pool.train()(torch.randn(2, 8, 3, 3, generator=torch.Generator().manual_seed(0)))
        >>> pool.lazy_init_pending, tuple(pool.last_histograms.shape)
        (False, (2, 4))
    """

    _last_outputs = ("last_histograms", "last_pooled")

    def __init__(
        self,
        in_channels: int,
        num_prototypes: int = 64,
        scale: Optional[float] = None,
        normalize: bool = True,
        device=None,
        dtype=None,
        seed: int = 0,
        lazy_init: Optional[str] = None,
        lazy_init_batches: int = 4,
        keepdim: bool = False,
    ):
        super().__init__()
        if not is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        for name, value in (
            ("in_channels", in_channels),
            ("num_prototypes", num_prototypes),
            ("lazy_init_batches", lazy_init_batches),
        ):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if scale is None:
            scale = DEFAULT_SCALE_NORMALIZED if normalize else PAPER_SCALE
        if not is_number(scale) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        if lazy_init is not None and lazy_init not in LAZY_INITS:
            raise ValueError(f"lazy_init must be None or one of {LAZY_INITS}, got {lazy_init!r}")
        self.in_channels = in_channels
        self.num_prototypes = num_prototypes
        self.scale = float(scale)
        self.normalize = bool(normalize)
        # built on the meta device so that the conv's default init never draws from the global RNG
        conv = torch.nn.Conv2d(in_channels, num_prototypes, kernel_size=1, bias=False, device="meta", dtype=dtype)
        conv.weight = torch.nn.Parameter(torch.empty(conv.weight.shape, device=device, dtype=dtype))
        self.prototype_conv = conv
        self.last_histograms: Optional[torch.Tensor] = None
        self.last_pooled: Optional[torch.Tensor] = None
        self.keepdim = bool(keepdim)
        self.lazy_init = lazy_init
        self.lazy_init_batches = lazy_init_batches
        self.reset_parameters()  # also sets the lazy-init state
        self.lazy_init_pending = lazy_init is not None

    @property
    def prototypes(self) -> torch.Tensor:
        """The prototypes ν as a ``[m, C]`` view of the 1×1 conv weight (raw, not normalised)."""
        return self.prototype_conv.weight.view(self.num_prototypes, self.in_channels)

    @property
    def num_features(self) -> int:
        return self.in_channels

    @property
    def histogram_size(self) -> int:
        return self.num_prototypes

    def feat_mult(self) -> int:
        """Output width multiplier relative to ``in_channels`` (1: the output is the C-wide GAP vector)."""
        return 1

    def reset_parameters(self, generator: Optional[torch.Generator] = None):
        """Random prototypes, i.i.d. N(0, 1/C), from ``generator`` (default: a CPU generator seeded with
        ``self.seed``); cancels a pending ``lazy_init``."""
        self._cancel_lazy_init()
        if generator is None:
            generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            shape = self.prototype_conv.weight.shape
            w = torch.randn(shape, generator=generator, dtype=torch.float32, device=generator.device)
            self.prototype_conv.weight.copy_(w / self.in_channels**0.5)

    def _space(self, x: torch.Tensor):
        # float32 or wider: F.normalize's eps is 0 in float16
        dtype = torch.promote_types(x.dtype, torch.float32)
        x, protos = x.to(dtype), self.prototypes.to(dtype)
        if self.normalize:
            return F.normalize(x, dim=1), F.normalize(protos, dim=1)
        return x, protos

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """ε · ν_iᵀ x_j for every prototype i and position j: ``[B, m, H, W]``, float32 (float64 for float64
        input), autocast disabled."""
        _check_feature_map(x, self.in_channels)
        with torch.autocast(device_type=x.device.type, enabled=False):
            feats, protos = self._space(x)
            return self.scale * F.conv2d(feats, protos[:, :, None, None])

    def histograms(self, x: torch.Tensor) -> torch.Tensor:
        """Soft histograms z' (paper eq. for the trainable histogram): ``[B, m]``, rows on the simplex."""
        return torch.softmax(self.logits(x), dim=1).mean(dim=(2, 3))

    def hard_histograms(self, x: torch.Tensor) -> torch.Tensor:
        """Hard histograms z* (Sec. 2.1): the fraction of positions whose nearest prototype (L2, comparison space)
        is i. ``[B, m]``, non-differentiable; the soft histogram's limit as ε → ∞ for equal-norm prototypes."""
        with torch.no_grad():
            flat, (_, protos) = self.local_features(x), self._space(x)
            b, _, h, w = x.shape
            nearest = torch.cdist(flat, protos.to(flat.dtype)).argmin(dim=1).view(b, h * w)
            return F.one_hot(nearest, self.num_prototypes).sum(dim=1).to(flat.dtype) / (h * w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and getattr(self, "lazy_init_pending", False):
            self._lazy_step(x)
        self.last_histograms = self.histograms(x)
        self.last_pooled = x.mean(dim=(2, 3))
        return self.last_pooled[:, :, None, None] if getattr(self, "keepdim", False) else self.last_pooled

    def _cancel_lazy_init(self):
        self.lazy_init_pending = False
        self._lazy_features = []
        self._lazy_generator = None

    @torch.no_grad()
    def _lazy_step(self, x: torch.Tensor):
        if self._lazy_generator is None:
            self._lazy_generator = torch.Generator().manual_seed(self.seed)
        feats = self.local_features(x.detach()).to("cpu", torch.float32)
        if not bool(torch.isfinite(feats).all()):
            raise ValueError(f"{type(self).__name__} lazy_init: the feature map has NaN or inf values")
        per_batch = max(self.num_prototypes, 20000 // self.lazy_init_batches)
        if len(feats) > per_batch:
            keep = torch.randperm(len(feats), generator=self._lazy_generator, device=self._lazy_generator.device)
            feats = feats[keep[:per_batch]]
        self._lazy_features.append(feats)
        kept = sum(len(f) for f in self._lazy_features)
        if len(self._lazy_features) < self.lazy_init_batches or kept < self.num_prototypes:
            return
        self.init_prototypes(torch.cat(self._lazy_features), method=self.lazy_init, seed=self.seed)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(self.prototype_conv.weight.data, src=0)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # prototypes from a checkpoint are given prototypes: a pending lazy initialisation must not replace them
        if prefix + "prototype_conv.weight" in state_dict:
            self._cancel_lazy_init()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def local_features(self, x: torch.Tensor) -> torch.Tensor:
        """Local features of ``x`` [B, C, H, W] as rows ``[B·H·W, C]`` in the layer's comparison space."""
        _check_feature_map(x, self.in_channels)
        feats, _ = self._space(x)
        return feats.permute(0, 2, 3, 1).reshape(-1, self.in_channels)

    def covering_radius(self, x: torch.Tensor) -> torch.Tensor:
        """δ of Lemma 2.1 over the features of ``x [B, C, H, W]``: the largest distance of a local feature to its
        nearest prototype (a 0-d tensor, in the features' units)."""
        with torch.no_grad():
            feats, (_, protos) = self.local_features(x), self._space(x)
            return torch.cdist(feats, protos.to(feats.dtype)).min(dim=1).values.max()

    def gap_reconstruction_error(self, x: torch.Tensor) -> torch.Tensor:
        """‖ȳ − V z*‖ per image, Lemma 2.1's left side: ȳ the mean local feature (comparison space), z* the hard
        histogram. ``[B]``. Lemma 2.1: every entry is ≤ :meth:`covering_radius` over the same features."""
        with torch.no_grad():
            feats, protos = self._space(x)
            mean = feats.mean(dim=(2, 3))
            return torch.linalg.vector_norm(mean - self.hard_histograms(x) @ protos.to(mean.dtype), dim=1)

    def init_prototypes(
        self,
        features: torch.Tensor,
        method: str = "kmeans",
        seed: int = 0,
        kmeans_iters: int = 20,
        log: Optional[Callable[[str], None]] = None,
    ) -> "HistogramPooling":
        """Initialise the prototypes from local features (the paper does not state an initialisation).

        Args:
            features: ``[N, C]`` local features (e.g. from :meth:`local_features`) or a ``[B, C, H, W]`` map.
            method: ``"kmeans"`` (faiss k-means), ``"kcenter"`` (greedy farthest-point, as the authors' GSP code
                does), or ``"random"`` (N(0, 1/C)).
            seed: seed for the random start / k-means initialisation.
            log: gets one note when k-means has fewer than :data:`KMEANS_POINTS_PER_PROTOTYPE` features per
                prototype (faiss's recommendation; its stderr warning is silenced).

        Raises:
            ValueError: on an unknown method or fewer features than prototypes.
        """
        self._cancel_lazy_init()
        if method not in PROTOTYPE_INITS:
            raise ValueError(f"method must be one of {PROTOTYPE_INITS}, got {method!r}")
        gen = torch.Generator().manual_seed(seed)
        if method == "random":
            self.reset_parameters(gen)
            return self
        if not torch.is_tensor(features) or features.ndim not in (2, 4) or not features.is_floating_point():
            raise ValueError(
                f"features must be a floating-point [N, {self.in_channels}] or [B, {self.in_channels}, H, W] tensor, "
                f"got {getattr(features, 'shape', type(features))}"
            )
        if not bool(torch.isfinite(features).all()):
            raise ValueError("features contains NaN or inf values")
        if features.ndim == 4:
            features = self.local_features(features)
        elif self.normalize:
            features = F.normalize(features, dim=1)
        features = features.detach().to("cpu", torch.float32)
        if features.ndim != 2 or features.shape[1] != self.in_channels:
            raise ValueError(f"features must be [N, {self.in_channels}], got {tuple(features.shape)}")
        if features.shape[0] < self.num_prototypes:
            raise ValueError(
                f"need at least num_prototypes={self.num_prototypes} features to initialise, got {features.shape[0]}"
            )
        if method == "kcenter":
            centres = self._greedy_k_center(features, gen)
        else:
            import faiss

            n, k = features.shape[0], self.num_prototypes
            if n < k * KMEANS_POINTS_PER_PROTOTYPE and log is not None:
                log(
                    f"note: k-means prototype initialisation: {n} local features for {k} prototypes (faiss "
                    f"recommends >= {KMEANS_POINTS_PER_PROTOTYPE} per prototype, {k * KMEANS_POINTS_PER_PROTOTYPE}); "
                    "more or larger images (prototype_init num_batches) give a steadier start"
                )
            # min_points_per_centroid=1 only silences faiss's stderr warning of the same fact
            km = faiss.Kmeans(
                self.in_channels, k, niter=kmeans_iters, seed=seed, verbose=False, min_points_per_centroid=1
            )
            km.train(features.numpy())
            centres = torch.from_numpy(km.centroids.copy())
        with torch.no_grad():
            self.prototype_conv.weight.copy_(centres.view_as(self.prototype_conv.weight))
        return self

    def _greedy_k_center(self, features, gen):
        first = int(torch.randint(len(features), (1,), generator=gen, device=gen.device))
        chosen = [first]
        dist = torch.cdist(features, features[first : first + 1]).squeeze(1)
        for _ in range(self.num_prototypes - 1):
            nxt = int(dist.argmax())
            chosen.append(nxt)
            dist = torch.minimum(dist, torch.cdist(features, features[nxt : nxt + 1]).squeeze(1))
        return features[chosen]

    @torch.no_grad()
    def init_from_data(
        self,
        body: torch.nn.Module,
        batches: Iterable,
        num_batches: int = 4,
        method: str = "kmeans",
        max_features: int = 20000,
        seed: int = 0,
        log: Optional[Callable[[str], None]] = None,
    ) -> "HistogramPooling":
        """Initialise prototypes from the local features ``body`` (the trunk before this layer) produces on
        ``num_batches`` of ``batches`` (images ``[B, 3, H, W]`` or ``(images, labels)``; eval mode, modes restored);
        ``log`` as :meth:`init_prototypes`."""
        device = self.prototype_conv.weight.device
        with eval_mode(body):
            feats = [
                self.local_features(body((b[0] if isinstance(b, (list, tuple)) else b).to(device))).cpu()
                for b in itertools.islice(batches, num_batches)
            ]
        if not feats:
            raise ValueError("batches yielded no data")
        feats = torch.cat(feats)
        if len(feats) > max_features:
            gen = torch.Generator().manual_seed(seed)
            feats = feats[torch.randperm(len(feats), generator=gen, device=gen.device)[:max_features]]
        return self.init_prototypes(feats, method=method, seed=seed, log=log)


def find_histogram_layers(module: torch.nn.Module) -> List[HistogramPooling]:
    """Every :class:`HistogramPooling` inside ``module`` (itself included), in ``module.modules()`` order.

    Example::

        >>> trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), HistogramPooling(8, 4))
        >>> [type(m).__name__ for m in find_histogram_layers(trunk)]
        ['HistogramPooling']
    """
    return [m for m in module.modules() if isinstance(m, HistogramPooling)]


def trunk_body(trunk: torch.nn.Module, layer: torch.nn.Module) -> torch.nn.Sequential:
    """The part of a ``Sequential`` trunk before its child ``layer`` (e.g. the body whose local features
    :meth:`HistogramPooling.init_from_data` clusters). The returned Sequential shares the trunk's modules.

    Raises:
        ValueError: if ``trunk`` is not a ``torch.nn.Sequential`` or ``layer`` is not one of its children.

    Example::

        >>> pool = HistogramPooling(8, 4)
        >>> body = trunk_body(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), pool, torch.nn.Flatten()), pool)
        >>> len(body)
        1
    """
    if not isinstance(trunk, torch.nn.Sequential):
        raise ValueError(
            f"trunk must be a torch.nn.Sequential ([body, HistogramPooling, ...]), got {type(trunk).__name__}"
        )
    children = list(trunk.children())
    if not any(c is layer for c in children):
        raise ValueError("layer must be a direct child of the Sequential trunk")
    return torch.nn.Sequential(*children[: next(i for i, c in enumerate(children) if c is layer)])


#: the keys of a ``prototype_init`` spec (:func:`prototype_init`)
PROTOTYPE_INIT_KEYS = ("method", "num_batches", "batch_size")


@param_group("prototype_lr")
def prototype_parameters(module: torch.nn.Module) -> List[torch.nn.Parameter]:
    """The prototypes of every :class:`HistogramPooling` in ``module``: the optimizer option ``prototype_lr`` puts
    them in a parameter group of their own at that learning rate.

    Example::

        >>> trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), HistogramPooling(8, 4))
        >>> [tuple(p.shape) for p in prototype_parameters(trunk)]
        [(4, 8, 1, 1)]
    """
    return [p for m in find_histogram_layers(module) for p in m.parameters() if p.requires_grad]


@data_init("prototype_init")
def prototype_init(models, dataset, seed: int, spec, log: Optional[Callable[[str], None]] = None) -> bool:
    """The config key ``prototype_init: {method: kmeans|kcenter|random, num_batches: 4, batch_size: 32}``: the
    trunk's HistogramPooling prototypes from its body's local features on ``num_batches`` batches of ``dataset``
    shuffled with ``seed`` (:meth:`HistogramPooling.init_from_data`). Returns False for an empty spec.

    Raises:
        ValueError: unknown keys, a trunk without exactly one HistogramPooling as a direct child of a Sequential
        trunk, or a bad method.
    """
    if not spec:
        return False
    if not isinstance(spec, dict):
        raise ValueError(f"expected a mapping {{method: kmeans, num_batches: 4}}, got {spec!r}")
    unknown = sorted(set(spec) - set(PROTOTYPE_INIT_KEYS))
    if unknown:
        raise ValueError(f"unknown keys {unknown}; known: {', '.join(PROTOTYPE_INIT_KEYS)}")
    trunk = models["trunk"]
    layers = find_histogram_layers(trunk)
    if len(layers) != 1:
        raise ValueError(f"needs exactly one HistogramPooling in the trunk, found {len(layers)}")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=int(spec.get("batch_size", 32)),
        shuffle=True,
        generator=torch.Generator().manual_seed(int(seed)),
    )
    body = trunk_body(trunk, layers[0])
    layers[0].init_from_data(
        body,
        loader,
        num_batches=int(spec.get("num_batches", 4)),
        method=spec.get("method", "kmeans"),
        seed=int(seed),
        log=log,
    )
    return True
