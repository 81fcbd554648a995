"""Swap a model's global average pooling for :class:`HistogramPooling` in one call (XML, Gurbuz & Alatan, ICIP 2023),
found by behaviour on a probe batch, and find the modules after it (docs/methods/xml.md)."""

from typing import List, Optional

import torch

from ..utils.eval_mode import eval_mode
from .histogram_pooling import HistogramPooling, find_histogram_layers
from .trunk_split import _first_line, _float_like

#: probe side (pixels) when no ``example_input`` is given: a stride-32 body still ends in a 4 × 4 map
PROBE_SIZE = 128


class _Call:
    __slots__ = ("name", "module", "is_gap", "is_map", "out_ndim", "in_channels", "out_channels")

    def __init__(self, name, module, inp, out):
        self.name, self.module = name, module
        self.is_gap = _is_spatial_mean(module, inp, out)
        self.is_map = _spatial_map(out)
        self.out_ndim = out.ndim if torch.is_tensor(out) else None
        self.in_channels = inp.shape[1] if _spatial_map(inp) else None
        self.out_channels = out.shape[1] if self.is_map else None


def _spatial_map(t) -> bool:
    return torch.is_tensor(t) and t.ndim == 4 and t.is_floating_point() and t.shape[2] * t.shape[3] > 1


def _first(x):
    if torch.is_tensor(x):
        return x
    if isinstance(x, (list, tuple)) and x and torch.is_tensor(x[0]):
        return x[0]
    return None


def _is_spatial_mean(module, inp, out) -> bool:
    if next(module.parameters(), None) is not None or not _spatial_map(inp) or not torch.is_tensor(out):
        return False
    b, c = inp.shape[:2]
    if tuple(out.shape) not in ((b, c), (b, c, 1, 1)) or not out.is_floating_point():
        return False
    mean = inp.float().mean(dim=(2, 3))
    return _close(out.reshape(b, c).float(), mean)


def _close(a, b, rel=1e-4) -> bool:
    if a.shape != b.shape:
        return False
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-12)
    return float((a - b).abs().max()) <= rel * scale


#: what :func:`use_histogram_pooling` and :func:`pooling_tail` take, for their refusals
SUPPORTED = (
    "supported: CNNs whose last [B, C, H, W] feature map is averaged by a pooling module (torchvision ResNet, "
    "MobileNetV2/V3, EfficientNet, ConvNeXt, RegNet, Swin; timm CNNs with global_pool) or a body ending in that map"
)


def _trace(model, example_input, caller="use_histogram_pooling"):
    """Run ``model`` once (eval, no grad): its output and every module call in completion order."""
    calls = []
    names = {}
    for name, m in model.named_modules():
        names.setdefault(id(m), name)

    def hook(module, args, out):
        calls.append(_Call(names[id(module)], module, _first(args), _first(out)))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with eval_mode(model), torch.no_grad():
            out = model(example_input)
    except Exception as e:  # a model this function does not support, or a probe of the wrong size for it
        raise ValueError(
            f"{caller}: {type(model).__name__} does not run on a {tuple(example_input.shape)} probe batch "
            f"({_first_line(e)}); {SUPPORTED}; a CNN that needs another input size takes example_input=[B, C, H, W]"
        ) from e
    finally:
        for h in handles:
            h.remove()
    return out, calls


def _below(name, ancestor) -> bool:
    return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")


def _probe(model, example_input):
    if example_input is not None:
        if not torch.is_tensor(example_input) or not example_input.is_floating_point():
            raise ValueError(
                f"example_input must be a floating-point tensor batch, got {getattr(example_input, 'shape', None)}"
            )
        return example_input
    conv = next((m for m in model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    if conv is None:
        raise ValueError(
            f"{type(model).__name__} has no Conv2d to infer its input channels from: pass example_input=[B, C, H, W]"
        )
    # drawn on the CPU from a seeded CPU generator (the same probe on every device), then moved to the model's device
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, conv.in_channels, PROBE_SIZE, PROBE_SIZE, generator=g, device=g.device).to(
        **_float_like(model)
    )


def _tensors(out):
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _same_output(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) > 0 and all(_close(x.float(), y.float()) for x, y in zip(ta, tb))


def use_histogram_pooling(
    model: torch.nn.Module,
    num_prototypes: int = 64,
    *,
    scale: Optional[float] = None,
    normalize: bool = True,
    prototypes: Optional[torch.Tensor] = None,
    init: Optional[str] = "kmeans",
    init_batches: int = 4,
    seed: int = 0,
    example_input: Optional[torch.Tensor] = None,
) -> torch.nn.Module:
    """Replace ``model``'s global average pooling by :class:`HistogramPooling` (in place) and return the model.

    The model computes what it computed before, in train and eval mode (checked on a probe batch): bit for bit where
    the replaced pooling is a spatial mean (``AdaptiveAvgPool2d(1)``, ``adaptive_avg_pool2d(x, 1)``,
    ``x.mean((2, 3))``), up to a few float32 ulps for a whole-map ``AvgPool2d``. The layer keeps the soft prototype
    histograms ``[B, m]`` of each forward for :class:`pml_extensions.losses.XMLWrapper`. Build the optimizers after
    the swap so that the prototypes train.

    Args:
        model: a CNN with a global average pooling (torchvision ResNet, MobileNetV2/V3, EfficientNet, ConvNeXt,
            RegNet; timm-style ``global_pool``), or a body that ends in a feature map.
        num_prototypes: m (paper: 64 for CUB/Cars, 128 for SOP/InShop).
        scale, normalize, seed: as :class:`HistogramPooling` (default: cosine logits with ε = 100).
        prototypes: ``[m, C]`` initial prototypes (then ``init`` is not used).
        init: ``"kmeans"`` (default) or ``"kcenter"``: initialise the prototypes lazily from the local features of
            the first ``init_batches`` (default 4) training forwards (``HistogramPooling(lazy_init=...)``); ``None``
            keeps the seeded random prototypes.
        example_input: the probe batch ``[B, C, H, W]`` (default: 2 seeded random images of ``PROBE_SIZE`` pixels,
            on the model's device and dtype).

    Returns:
        ``model`` itself, or a new ``Sequential(model, layer)`` when ``model`` is a body ending in the feature map.

    Raises:
        ValueError: ``model`` already holds a HistogramPooling; it does not run on the probe batch (e.g. a vision
            transformer; one line naming the model and what is supported); no global average pooling or feature map is
            found; or the swap would change the model's output or stop it from running (the model is left unchanged).

    Example::

        >>> import torchvision
        >>> model = torchvision.models.resnet18(num_classes=10)
        >>> model = use_histogram_pooling(model, num_prototypes=8)
        >>> type(model.avgpool).__name__, tuple(model(torch.rand(2, 3, 64, 64)).shape)
        ('HistogramPooling', (2, 10))
        >>> tuple(model.avgpool.last_histograms.shape)
        (2, 8)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if find_histogram_layers(model):
        raise ValueError(f"{type(model).__name__} already holds a HistogramPooling: swap the pooling of a fresh model")
    if prototypes is not None and (not torch.is_tensor(prototypes) or prototypes.ndim != 2):
        raise ValueError(f"prototypes must be a [m, C] tensor, got {getattr(prototypes, 'shape', type(prototypes))}")
    x = _probe(model, example_input)
    before, calls = _trace(model, x)
    site = _global_pooling(calls)
    appended = site is None
    if appended:
        site = next((c for c in reversed(calls) if c.is_map), None)  # the outermost module of the last map
        if site is None:
            raise ValueError(
                f"{type(model).__name__}: no global average pooling and no [B, C, H, W] feature map with more than "
                f"one position on a {tuple(x.shape)} probe ({SUPPORTED}; pass a larger example_input, or put "
                "pml_extensions.trunks.HistogramPooling into the model yourself)"
            )
    channels = site.out_channels if appended else site.in_channels
    pool = HistogramPooling(
        channels,
        num_prototypes if prototypes is None else prototypes.shape[0],
        scale=scale,
        normalize=normalize,
        device=_float_like(model)["device"],
        seed=seed,
        lazy_init=init if prototypes is None else None,
        lazy_init_batches=init_batches,
        # the pooling's own output shape; appended inside the model: [B, C, 1, 1], which the model's functional
        # pooling leaves as it is; appended after a body: the [B, C] GAP vector
        keepdim=(site.name != "") if appended else site.out_ndim == 4,
    )
    if prototypes is not None:
        if prototypes.shape[1] != channels:
            raise ValueError(f"prototypes must be [m, {channels}] (the pooled map's channels), got {prototypes.shape}")
        with torch.no_grad():
            pool.prototype_conv.weight.copy_(prototypes.detach().reshape(pool.prototype_conv.weight.shape))
    if appended and site.name == "":
        return torch.nn.Sequential(model, pool)
    if appended:
        target = model.get_submodule(site.name)
        if not isinstance(target, torch.nn.Sequential):
            raise ValueError(
                f"{type(model).__name__} has no global average pooling module, and its last feature map comes out "
                f"of `{site.name}` (a {type(target).__name__}), not a Sequential the layer could be appended to "
                f"({SUPPORTED}): put HistogramPooling({channels}) into the model yourself"
            )
        target.append(pool)
        undo = lambda: target.pop(-1)  # noqa: E731
        where = f"appended to `{site.name}`"
    else:
        parent_name, _, attr = site.name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, pool)
        undo = lambda: setattr(parent, attr, site.module)  # noqa: E731
        where = f"in place of `{site.name}` ({type(site.module).__name__})"
    failure = None
    try:
        if not _same_output(before, _trace(model, x)[0]):
            failure = (
                f"HistogramPooling {where} changes the model's output (the model does more than average its last "
                "feature map there, e.g. a ReLU in forward())"
            )
    except Exception as e:  # the model's code after the pooling cannot take the layer's output
        failure = f"with HistogramPooling {where} the model no longer runs ({_first_line(e.__cause__ or e)})"
    if failure:
        undo()
        raise ValueError(
            f"{type(model).__name__}: {failure}; the model is left unchanged: put HistogramPooling into the model "
            "yourself"
        ) from None
    return model


def _global_pooling(calls) -> Optional[_Call]:
    # the innermost spatial-mean module of the last pooling group, if no spatial map is computed after it
    gaps = [i for i, c in enumerate(calls) if c.is_gap]
    if not gaps:
        return None
    last = calls[gaps[-1]]
    inner = [i for i in gaps if _below(calls[i].name, last.name)]
    i = inner[0]  # hooks fire inner-first: the first of the group is the innermost
    site = calls[i]
    if sum(c.module is site.module for c in calls) != 1:
        return None  # a pooling module called more than once is not the model's one global pooling
    later = [c for c in calls[i + 1 :] if not _below(site.name, c.name)]  # not an ancestor of the site
    if any(c.is_map for c in later):
        return None
    return site


def pooling_tail(
    model: torch.nn.Module, layer: Optional[HistogramPooling] = None, example_input: Optional[torch.Tensor] = None
) -> List[torch.nn.Module]:
    """The modules ``model`` applies to the GAP vector after its :class:`HistogramPooling` ``layer``, in order, so that
    ``model(x)`` equals them applied to ``layer.last_pooled`` (checked on a probe batch; led by an ``Unflatten`` to
    ``[N, C, 1, 1]`` where the next module needs the 4-D shape); ``[]`` when the model's output is the GAP vector.

    Args:
        model: a model holding ``layer``; layer: its HistogramPooling (default: the single one inside ``model``).
        example_input: the probe batch (default as in :func:`use_histogram_pooling`).

    Raises:
        ValueError: ``model`` holds no or several HistogramPooling layers (without ``layer``), does not run on the probe
            batch, runs ``layer`` other than once, or its output is not the found modules applied to the GAP vector.

    Example::

        >>> import torchvision
        >>> model = use_histogram_pooling(torchvision.models.resnet18(num_classes=10), num_prototypes=8)
        >>> [type(m).__name__ for m in pooling_tail(model)]
        ['Linear']
    """
    if layer is None:
        layers = find_histogram_layers(model)
        if len(layers) != 1:
            raise ValueError(f"{type(model).__name__} must hold exactly one HistogramPooling, found {len(layers)}")
        layer = layers[0]
    x = _probe(model, example_input)
    out, calls = _trace(model, x, "pooling_tail")
    index = [i for i, c in enumerate(calls) if c.module is layer]
    if len(index) != 1:
        raise ValueError(f"the HistogramPooling must run exactly once in {type(model).__name__}, ran {len(index)}")
    site = calls[index[0]]
    later = [c for c in calls[index[0] + 1 :] if not _below(site.name, c.name)]
    tail = [c for c in later if not any(o is not c and _below(c.name, o.name) for o in later)]
    names = ", ".join(c.name for c in tail) or "none"
    # the GAP vector [N, C] goes in as it is or, for a [B, C, 1, 1] pooling (ConvNeXt's classifier starts with a
    # LayerNorm2d), as a 1 x 1 map
    starts = [[]] + ([[torch.nn.Unflatten(1, (layer.in_channels, 1, 1))]] if layer.keepdim else [])
    for start in starts:
        chain = start + [c.module for c in tail]
        with eval_mode(model), torch.no_grad():
            y = layer.last_pooled
            try:
                for m in chain:
                    y = m(y)
            except Exception:  # a module that does not take this shape: not the chain
                continue
        if torch.is_tensor(out) and torch.is_tensor(y) and _close(y.float(), out.float()):
            return chain
    raise ValueError(
        f"{type(model).__name__}: its output is not its modules after the HistogramPooling ({names}) applied to the "
        "GAP vector (functional code after the pooling?); pass XMLWrapper(head=...) yourself"
    )
