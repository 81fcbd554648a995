"""Feature embedding by template matching (Gorgun, Gurbuz & Alatan, BMVC 2022, arXiv 2210.00992, Sec. 3.3, Fig. 2);
the block's steps and our deviations: docs/methods/template_matching.md. No official code exists; the add-variant
matches ``valueLayer_1x1sum`` in ``adagorgun/letKD-framework`` structurally, no code copied."""

from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ..utils.checks import is_int
from ._last_outputs import _KeepsLastOutputs
from .histogram_pooling import _check_feature_map
from .margin_softmax import MarginAugmentedSoftmax
from .perturbed_maximizer import PerturbedMaximizer

MIXINGS = ("bn_relu", "softmax", "perturbed", "none")
COMBINES = ("add", "concat")
#: ``"paper"``: random 1×1 convs (PyTorch's default, as in the paper's from-scratch training); ``"identity"``: the
#: block starts as f_out = f (shortcut = identity, value vectors = 0)
INITS = ("paper", "identity")


def _pair(window, name="window") -> Optional[Tuple[int, int]]:
    if window is None:
        return None
    if is_int(window):
        window = (window, window)
    if not isinstance(window, (tuple, list)) or len(window) != 2 or any(not is_int(w) or w < 1 for w in window):
        raise ValueError(f"{name} must be None, a positive int or a pair of positive ints, got {window!r}")
    return int(window[0]), int(window[1])


def same_patch_mean(feature_map: torch.Tensor, window: Union[int, Sequence[int]]) -> torch.Tensor:
    """Mean over the (kh × kw) window centred on every pixel, 'same' output size, padding excluded from the mean.

    An odd k spans [i − (k−1)/2, i + (k−1)/2], an even k [i − (k/2 − 1), i + k/2] (TensorFlow 'same' padding).

    Args:
        feature_map: ``[B, C, H, W]`` float tensor.
        window: k or (kh, kw), each between 1 and the map's size.

    Returns: ``[B, C, H, W]`` on the input's device and dtype.

    Raises:
        ValueError: if the map is not 4-D or the window is not positive or larger than the map.
        TypeError: if the map is not floating-point.
    """
    _check_feature_map(feature_map, name="feature_map")
    kh, kw = _pair(window)
    h, w = feature_map.shape[-2:]
    if kh > h or kw > w:
        raise ValueError(f"window {(kh, kw)} is larger than the {h}×{w} feature map")
    pad = ((kw - 1) // 2, kw // 2, (kh - 1) // 2, kh // 2)  # left, right, top, bottom
    sums = F.avg_pool2d(F.pad(feature_map, pad), (kh, kw), stride=1, divisor_override=1)
    ones = feature_map.new_ones(1, 1, h, w)
    counts = F.avg_pool2d(F.pad(ones, pad), (kh, kw), stride=1, divisor_override=1)
    return sums / counts


class TemplateMatchingBlock(_KeepsLastOutputs, torch.nn.Module):
    """Template-matching block between the last two stages of a CNN (paper Sec. 3.3, Fig. 2).

    Args:
        in_channels: d, channels of the input map f.
        num_classes: c ≥ 2, training classes scored by the patch classifier (the aux loss's classes).
        value_channels: d', width of f' (the value vectors ν_k). Default ``in_channels``.
        window: patch window (kh, kw) or k; ``None`` (default, paper) uses (max(1, H // 2), max(1, W // 2)) of
            each input map, i.e. the paper's w/2 × h/2.
        mixing: how scores become mixing coefficients: ``"bn_relu"`` (default, paper: ReLU(BatchNorm2d(c)(a))),
            ``"softmax"`` (:class:`MarginAugmentedSoftmax`), ``"perturbed"`` (:class:`PerturbedMaximizer`), or
            ``"none"`` (the paper's "auxiliary loss only" baseline: the block returns f and only scores patches).
        combine: ``"add"`` (default, paper): f_out = conv1×1(f) + f', width d'; ``"concat"`` (paper's DenseNet
            "Ours-C"): f_out = [f, f'], width d + d', no shortcut conv.
        mu, epsilon, eta, num_samples, seed: the soft maximizer's (defaults μ = 0, ε = 1, η = 1, S = 600, seed 0).
        norm_layer, act_layer: the ``"bn_relu"`` classes (default BatchNorm2d, called with ``device``/``dtype``; ReLU).
        init: ``"paper"`` (default): PyTorch's random 1×1 convs, as in the paper's from-scratch training;
            ``"identity"``: :meth:`init_identity` after construction (f_out = f; the classifier stays random). The
            random draws are the same in both.
        device, dtype: factory arguments of the convolutions.

    ``forward(f [B, d, H, W]) -> [B, out_channels, H, W]``; ``out_channels`` is d' (add), d + d' (concat) or d
    (``mixing="none"``). After every forward ``last_class_scores`` holds a ``[B, c, H, W]`` (graph attached) and
    ``last_mixing`` p̂ ``[B, c, H, W]`` (``None`` for ``mixing="none"``); copies of the block hold ``None`` until
    their own forward. 1×1 convs: ``classifier`` (d → c, bias), ``values`` (c → d', no bias), ``shortcut`` (d → d',
    no bias; add only); ``mixing="none"`` has the classifier alone. The paper does not state whether the shortcut
    and value convs have a bias; here neither does.

    Raises:
        ValueError: on ``num_classes`` < 2, non-positive widths, unknown ``mixing``/``combine``/``init`` (lists the
            valid ones), a malformed window, ``init="identity"`` where the block cannot be the identity (see
            :meth:`init_identity`), or at forward time a map with the wrong rank/width or smaller than the window.
        TypeError: at forward time, a map that is not floating-point.

    Example::

        >>> block = TemplateMatchingBlock(8, num_classes=5, init="identity").eval()
        >>> f = torch.randn(2, 8, 6, 6)
        >>> torch.equal(block(f), f), tuple(block.last_class_scores.shape)
        (True, (2, 5, 6, 6))
    """

    expansion = 1  # timm/torchvision block convention
    _last_outputs = ("last_class_scores", "last_mixing")

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        value_channels: Optional[int] = None,
        window: Optional[Union[int, Sequence[int]]] = None,
        mixing: str = "bn_relu",
        combine: str = "add",
        mu: float = 0.0,
        epsilon: float = 1.0,
        eta: float = 1.0,
        num_samples: int = 600,
        seed: int = 0,
        norm_layer=torch.nn.BatchNorm2d,
        act_layer=torch.nn.ReLU,
        init: str = "paper",
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("num_classes", num_classes)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (the block scores patches against classes), got {num_classes}")
        if value_channels is None:
            value_channels = in_channels
        if not is_int(value_channels) or value_channels < 1:
            raise ValueError(f"value_channels must be None or a positive int, got {value_channels!r}")
        for name, value, options in (
            ("mixing", mixing, MIXINGS),
            ("combine", combine, COMBINES),
            ("init", init, INITS),
        ):
            if value not in options:
                raise ValueError(f"{name} must be one of {options}, got {value!r}")
        self.window = _pair(window)
        self.in_channels, self.num_classes, self.value_channels = in_channels, num_classes, value_channels
        self.mixing, self.combine = mixing, combine
        fk = {"device": device, "dtype": dtype}
        self.classifier = torch.nn.Conv2d(in_channels, num_classes, 1, bias=True, **fk)
        self.mixer: Optional[torch.nn.Module] = None
        self.values: Optional[torch.nn.Module] = None
        self.shortcut: Optional[torch.nn.Module] = None
        if mixing != "none":
            if mixing == "bn_relu":
                self.mixer = torch.nn.Sequential(norm_layer(num_classes, **fk), act_layer())
            elif mixing == "softmax":
                self.mixer = MarginAugmentedSoftmax(mu=mu, epsilon=epsilon, eta=eta, dim=1)
            else:
                self.mixer = PerturbedMaximizer(
                    mu=mu, epsilon=epsilon, eta=eta, num_samples=num_samples, seed=seed, dim=1
                )
            self.values = torch.nn.Conv2d(num_classes, value_channels, 1, bias=False, **fk)
            if combine == "add":
                self.shortcut = torch.nn.Conv2d(in_channels, value_channels, 1, bias=False, **fk)
        self.last_class_scores: Optional[torch.Tensor] = None
        self.last_mixing: Optional[torch.Tensor] = None
        if init == "identity":
            self.init_identity()

    @property
    def out_channels(self) -> int:
        """Width of the output map: d' (add), d + d' (concat), d (mixing="none")."""
        if self.mixing == "none":
            return self.in_channels
        return self.value_channels if self.combine == "add" else self.in_channels + self.value_channels

    def zero_init_last(self) -> None:
        """Zero the value vectors ν (timm's ``zero_init_last``): f' = 0, so the block starts as conv1×1(f) (add) or
        [f, 0] (concat)."""
        if self.values is not None:
            torch.nn.init.zeros_(self.values.weight)

    @torch.no_grad()
    def init_identity(self) -> "TemplateMatchingBlock":
        """Start the block as the identity, f_out = f: the shortcut conv becomes the identity (``torch.nn.init.dirac_``)
        and the value vectors ν zero (:meth:`zero_init_last`); the classifier and the mixer keep their weights (not in
        the paper, whose networks train from scratch). Exact on the CPU and on a GPU without TF32 (TF32 or autocast
        round f like every conv of the host; a non-finite f gives NaN). ``mixing="none"``: nothing changes.

        Returns: the block itself.

        Raises:
            ValueError: for ``combine="concat"`` (the output [f, f'] is wider than f) or ``value_channels`` ≠
                ``in_channels`` (the shortcut changes the width).
        """
        if self.mixing == "none":
            return self
        if self.combine == "concat":
            raise ValueError(
                "init='identity' needs combine='add': the concat output [f, f'] is wider than f, so the block alone "
                "cannot be the identity (insert_template_matching zero-widens the next layer instead)"
            )
        if self.value_channels != self.in_channels:
            raise ValueError(
                f"init='identity' needs value_channels == in_channels (the shortcut maps {self.in_channels} to "
                f"{self.value_channels} channels, which no identity does)"
            )
        # torch.nn.init.dirac_ for this square 1 x 1 conv in one indexed write (dirac_ writes its C ones one by one:
        # C tiny device ops, i.e. kernel launches on a GPU)
        weight = self.shortcut.weight
        weight.zero_()
        channels = torch.arange(min(weight.shape[0], weight.shape[1]), device=weight.device)
        weight[channels, channels, weight.shape[2] // 2, weight.shape[3] // 2] = 1
        self.zero_init_last()
        return self

    def feat_mult(self) -> float:
        """Output width relative to ``in_channels`` (timm's ``feat_mult`` convention)."""
        return self.out_channels / self.in_channels

    def extra_repr(self) -> str:
        return f"window={self.window or 'half'}, mixing={self.mixing!r}, combine={self.combine!r}"

    def window_for(self, height: int, width: int) -> Tuple[int, int]:
        """The (kh, kw) window used on an H × W map."""
        if self.window is not None:
            return self.window
        return max(1, height // 2), max(1, width // 2)

    def class_scores(self, feature_map: torch.Tensor) -> torch.Tensor:
        """a = classifier(patch mean of f): ``[B, c, H, W]`` per-pixel class scores (logits)."""
        _check_feature_map(feature_map, self.in_channels, "feature_map", "block")
        pooled = same_patch_mean(feature_map, self.window_for(*feature_map.shape[-2:]))
        return self.classifier(pooled)

    def forward(self, feature_map: torch.Tensor) -> torch.Tensor:
        scores = self.class_scores(feature_map)
        self.last_class_scores = scores
        if self.mixing == "none":
            self.last_mixing = None
            return feature_map
        mix = self.mixer(scores)
        self.last_mixing = mix
        embedded = self.values(mix)
        if self.combine == "add":
            return self.shortcut(feature_map) + embedded
        return torch.cat([feature_map, embedded], dim=1)
